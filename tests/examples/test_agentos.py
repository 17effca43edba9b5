"""AgentOS seed ("AgentOS Chat Session Isolation"): serve an agent, chat with a session.

The quick start runs as a user's script in a process of its own (on a free port instead of
8000, which this shared machine may have taken), and both of its curl calls are made with httpx.
What the page promises: a supplied ``session_id`` continues that conversation ("the agent
remembers 'Alice' for this session id"), the response is ``{response, agent_name, session_id}``
with the id echoed verbatim, an omitted id is a fresh session each call, and two clients on two
session ids never see each other's transcripts; and, where the page warns that an agent with
handoffs loses that isolation, tether keeps it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from tests.examples.conftest import Seed, reader, said
from tests.server.conftest import free_port
from tether.testing.fake_openai import FakeReply, FakeToolCall

pytestmark = pytest.mark.slow  # a real server process

SERVE = """
from tether import AgentOS
from tether import Agent

app = AgentOS(agents=[
    Agent(name="assistant", instructions="Be helpful"),
])
app.serve(port=8000)
"""


def _serve(seed: Seed, port: int, code: str = SERVE) -> subprocess.Popen[bytes]:
    script = seed.cwd / "myapp.py"
    script.write_text(code.replace("port=8000", f"port={port}"))
    with (seed.cwd / "serve.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, str(script)],
            cwd=seed.cwd,
            env=seed.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_ready(proc: subprocess.Popen[bytes], url: str, seed: Seed) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = (seed.cwd / "serve.log").read_text()
            raise AssertionError(f"the script exited {proc.returncode}:\n{log}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("the script's server was not ready in time")


def test_quick_start_serves_and_continues_a_session(seed: Seed) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(seed, port)
    try:
        _wait_ready(proc, url, seed)
        with httpx.Client(base_url=url, timeout=30) as c:
            # First turn — mint a session by supplying an id
            first = c.post(
                "/api/chat",
                headers={"Content-Type": "application/json"},
                json={
                    "message": "Hi, my name is Alice.",
                    "session_id": "alice",
                    "agent_name": "assistant",
                },
            )
            # Follow-up on the same session — the agent remembers "Alice" for this session id
            follow_up = c.post(
                "/api/chat",
                headers={"Content-Type": "application/json"},
                json={
                    "message": "What is my name?",
                    "session_id": "alice",
                    "agent_name": "assistant",
                },
            )
            assert first.status_code == 200, first.text
            assert follow_up.status_code == 200, follow_up.text
            body = follow_up.json()
            assert (body["response"], body["agent_name"], body["session_id"]) == (
                "Your name is Alice.",
                "assistant",
                "alice",
            )
            assert first.json()["session_id"] == "alice"  # echoed verbatim
            # Remembered from the session's own history, under the agent's instructions.
            assert said(seed.fake.chat_requests[-1]) == [
                ("system", "Be helpful"),
                ("user", "Hi, my name is Alice."),
                ("assistant", "echo: Hi, my name is Alice."),
                ("user", "What is my name?"),
            ]
            # An omitted id: each call a fresh session, which knows nothing of the others.
            fresh = [c.post("/api/chat", json={"message": "What is my name?"}) for _ in range(2)]
            ids = {r.json()["session_id"] for r in fresh}
            assert len(ids) == 2 and "alice" not in ids
            assert {r.json()["response"] for r in fresh} == {"I do not know your name."}
        _two_clients_never_see_each_other(url, seed)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _two_clients_never_see_each_other(url: str, seed: Seed) -> None:
    """Two concurrent clients on different session ids: neither transcript reaches the other's
    model requests or replies."""
    names = ["Ada", "Boris", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hiro"]

    async def client(name: str) -> list[str]:
        sid = f"iso-{name.lower()}"
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            replies = []
            for message in (f"Hi, my name is {name}.", "What is my name?"):
                r = await c.post("/api/chat", json={"message": message, "session_id": sid})
                assert r.status_code == 200, r.text
                replies.append(r.json()["response"])
            return replies

    async def all_clients() -> list[list[str]]:
        return await asyncio.gather(*(client(n) for n in names))

    seed.fake.reset()
    results = asyncio.run(all_clients())
    assert [r[1] for r in results] == [f"Your name is {n}." for n in names]
    for request in seed.fake.chat_requests:
        seen = {n for n in names if any(n in content for _, content in said(request))}
        assert len(seen) == 1, seen  # each request carries one client's conversation only


HANDOFF_SERVE = """
from tether import AgentOS
from tether import Agent

billing = Agent(name="billing", instructions="You handle billing.")
app = AgentOS(agents=[
    Agent(name="assistant", instructions="Be helpful", handoffs=[billing]),
])
app.serve(port=8000)
"""


def _desk_reply(body: dict[str, Any]) -> FakeReply:
    """The assistant hands bills to billing (when it is offered the transfer); every other
    request is answered with whose instructions it ran and the user messages it was shown."""
    messages = body["messages"]
    offered = {t["function"]["name"] for t in body.get("tools") or []}
    last = messages[-1]
    if "transfer_to_billing" in offered and last["role"] == "user" and "bill" in last["content"]:
        return FakeToolCall("transfer_to_billing", '{"reason": "a bill"}')
    users = [str(m["content"]) for m in messages if m["role"] == "user"]
    return f"{messages[0]['content']} | saw: {' / '.join(users)}"


def test_an_agent_with_handoffs_keeps_each_session_apart(seed: Seed) -> None:
    """The page's warning: there, an agent with ``handoffs`` is served from one shared
    template, so ``chat_history`` is shared and ``session_id`` is not bound. tether keeps the
    isolation: each session is handed over on its own, and continues with its own history."""
    seed.fake.reply = _desk_reply
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(seed, port, HANDOFF_SERVE)
    names = ["ada", "boris", "chiara", "dmitri", "esther", "farid"]

    async def client(name: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            out = []
            for message in (f"my bill, {name}", f"and the refund, {name}?"):
                r = await c.post("/api/chat", json={"message": message, "session_id": name})
                assert r.status_code == 200, r.text
                out.append(r.json())
            return out

    async def all_clients() -> list[list[dict[str, Any]]]:
        return await asyncio.gather(*(client(n) for n in names))

    try:
        _wait_ready(proc, url, seed)
        results = asyncio.run(all_clients())
        for name, (first, second) in zip(names, results, strict=True):
            assert (first["agent_name"], first["session_id"]) == ("billing", name)
            assert first["response"] == f"You handle billing. | saw: my bill, {name}"
            # The next message stays with billing, on this session's history only.
            assert second["agent_name"] == "billing"
            assert second["response"] == (
                f"You handle billing. | saw: my bill, {name} / and the refund, {name}?"
            )
        for request in seed.fake.chat_requests:
            seen = {n for n in names if any(n in content for _, content in said(request))}
            assert len(seen) == 1, seen
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        seed.fake.reply = reader
        if proc.poll() is None:
            proc.kill()
            proc.wait()
