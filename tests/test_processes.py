"""Real processes: a second process resumes a conversation; kill -9 mid-turn loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PRELUDE = """
import json, sys, time
from pathlib import Path
from tether import Agent, tool
from tether.models.base import ModelRequest
from tether.testing import ScriptedModel, ToolCalls, Call

def digest(request: ModelRequest) -> str:
    users = [m.content for m in request.messages if m.role == "user"]
    return f"saw [{', '.join(users[:-1])}] then {users[-1]}"
"""


def run_script(tmp_path: Path, name: str, body: str, **kw: object) -> subprocess.Popen[str]:
    script = tmp_path / f"{name}.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = {**os.environ, "TETHER_DATA_DIR": str(tmp_path / "data")}
    return subprocess.Popen(
        [sys.executable, str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def test_second_process_continues_the_conversation(tmp_path: Path) -> None:
    body = """
    agent = Agent(name="Assistant", model=ScriptedModel(default=digest),
                  memory={"session_id": "my-session-123"})
    print(agent.start(sys.argv[0].split("/")[-1].removesuffix(".py")))
    """
    first = finish(run_script(tmp_path, "first", body))
    second = finish(run_script(tmp_path, "second", body))
    assert first.strip() == "saw [] then first"
    assert second.strip() == "saw [first] then second"


def test_kill_9_mid_turn_then_restart_recovers(tmp_path: Path) -> None:
    marker = tmp_path / "tool-started"
    crash = f"""
    @tool
    def slow_write(path: str) -> str:
        '''Pretend to do slow work.'''
        Path({str(marker)!r}).write_text("started")
        time.sleep(3600)
        return "never"

    model = ScriptedModel("one done", "two done", ToolCalls(Call("slow_write", {{"path": "x"}})))
    agent = Agent(name="A", model=model, tools=[slow_write], memory={{"session_id": "k9"}})
    agent.chat("one")
    agent.chat("two")
    agent.chat("three")  # killed inside the tool
    """
    proc = run_script(tmp_path, "crash", crash)
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)

    restart = """
    import asyncio
    from tether.embedded import default_runtime
    from tether.records import SessionKey
    agent = Agent(name="A", model=ScriptedModel("four done"), memory={"session_id": "k9"})
    print(agent.chat("four"))
    rt = default_runtime()
    key = SessionKey("local", "local", "k9")
    async def dump():
        turns = await rt.runtime.store.list_turns(key)
        items = await rt.runtime.store.list_items(key, limit=100)
        events = {t.id: [e.type for e in await rt.runtime.store.list_events(key, t.id)]
                  for t in turns}
        return {
            "turns": [[t.input, t.status, t.reason] for t in turns],
            "items": [[i.kind, i.content, i.call_id, i.excluded] for i in items],
            "events": events,
        }
    fut = asyncio.run_coroutine_threadsafe(dump(), rt.loop)
    print(json.dumps(fut.result()))
    """
    out = finish(run_script(tmp_path, "restart", restart)).splitlines()
    assert out[0] == "four done"
    state = json.loads(out[1])
    assert state["turns"] == [
        ["one", "completed", "answered"],
        ["two", "completed", "answered"],
        ["three", "failed", "owner_lost"],
        ["four", "completed", "answered"],
    ]
    items = state["items"]
    assert [(k, c) for k, c, _, _ in items[:4]] == [
        ("user", "one"),
        ("assistant", "one done"),
        ("user", "two"),
        ("assistant", "two done"),
    ]
    calls = [i for i in items if i[0] == "tool_call"]
    results = [i for i in items if i[0] == "tool_result"]
    assert len(calls) == 1 and len(results) == 1 and calls[0][2] == results[0][2]
    assert "aborted" in results[0][1]
    # The failed turn's items are kept for audit but flagged: they never reach a model again.
    assert all(excluded for kind, content, _, excluded in items if content in ("three",))
    for tid, types in state["events"].items():
        assert types.count("turn.ended") == 1, (tid, types)


def test_a_decision_made_in_another_process_resumes_the_turn_there(tmp_path: Path) -> None:
    # Before, the deciding process took the turn without serving its agent: it ended
    # failed/agent_not_found, and the tool never ran; and it went on as the local admin, not
    # as the session's user.
    body = """
    from tether import Session, ToolContext
    from tether.errors import ConfigError, DecisionRequired

    @tool(requires_approval=True)
    def deploy(target: str, ctx: ToolContext) -> str:
        "Deploy something (a human approves it)."
        return f"deployed {target} for {ctx.principal.user}"

    def deploys(request: ModelRequest):
        if request.messages[-1].role == "tool":
            return f"tool said: {request.messages[-1].content}"
        return ToolCalls(Call("deploy", {"target": "prod"}))

    mode = sys.argv[0].split("/")[-1].removesuffix(".py")
    session = Session(session_id="xp1", user_id="xu")
    if mode != "bare":
        session.Agent(name="deployer", model=ScriptedModel(default=deploys), tools=[deploy])
    if mode == "ask":
        try:
            session.chat("ship it")
        except DecisionRequired as exc:
            print("waits on", exc.decision.payload["tool"])
    else:
        [pending] = session.decisions()
        try:
            print(session.decide(pending, "approve"))
        except ConfigError as exc:
            print("refused:", "does not serve the agent 'deployer'" in str(exc))
        print(json.dumps([(d.status, d.decided_by) for d in session.decisions(status=None)]))
    """
    assert finish(run_script(tmp_path, "ask", body)).strip() == "waits on deploy"
    # A process that defines no agent is refused before anything is recorded.
    out = finish(run_script(tmp_path, "bare", body)).splitlines()
    assert out == ["refused: True", '[["pending", null]]']
    out = finish(run_script(tmp_path, "decide", body)).splitlines()
    assert out == ["tool said: deployed prod for xu", '[["approved", "xu"]]']
