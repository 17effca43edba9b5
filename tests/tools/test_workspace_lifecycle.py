"""A session's workspace goes with the session: deleted, expired, cleared with ``workspace``, its
user forgotten (DESIGN §8 "Lifecycles"); nobody else's workspace goes with it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tether import Agent, ToolContext, tool
from tether.records import LOCAL_PRINCIPAL, Principal, SessionKey
from tether.runtime import Runtime
from tether.store.sqlite import SQLiteStore
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools.workspace import ensure_workspace, workspace_dir

BOB = Principal("local", "bob")


@tool
def note(text: str, ctx: ToolContext) -> str:
    """Write a note into this session's workspace."""
    assert ctx.workspace is not None
    (ensure_workspace(ctx.workspace) / "note.txt").write_text(text)
    return "noted"


def _agent() -> Agent:
    model = ScriptedModel(
        default=lambda r: (
            "done" if r.messages[-1].role == "tool" else ToolCalls(Call("note", {"text": "hello"}))
        )
    )
    return Agent(name="a", model=model, tools=[note], memory={"auto": False})


def key(sid: str, who: Principal = LOCAL_PRINCIPAL) -> SessionKey:
    return SessionKey(who.tenant, who.user, sid)


async def _with_notes(rt: Runtime, agent: Agent, *keys: SessionKey) -> list[Path]:
    """One turn per session, each writing its note; the workspaces, which now hold a file."""
    for k in keys:
        who = LOCAL_PRINCIPAL if k.owner == LOCAL_PRINCIPAL.user else BOB
        assert await rt.chat(agent, "note it", session_id=k.session_id, principal=who) == "done"
    found = [workspace_dir(rt.workspace_root, k) for k in keys]
    assert all((w / "note.txt").read_text() == "hello" for w in found)
    return found


async def test_deleting_a_session_removes_its_workspace_alone(tmp_path: Path) -> None:
    agent = _agent()
    async with Runtime(SQLiteStore(tmp_path / "t.db"), data_dir=tmp_path, agents=[agent]) as rt:
        gone, kept, bobs = await _with_notes(rt, agent, key("s1"), key("s2"), key("s1", BOB))
        assert await rt.sessions.delete(key("s1"))
        assert not gone.exists()
        assert (kept / "note.txt").exists() and (bobs / "note.txt").exists()
        # The id starts afresh: no file of the deleted session is there for the next one.
        await rt.ensure_session(key("s1"), "a")
        assert not gone.exists()


async def test_clearing_history_keeps_the_workspace_unless_asked(tmp_path: Path) -> None:
    agent = _agent()
    async with Runtime(SQLiteStore(tmp_path / "t.db"), data_dir=tmp_path, agents=[agent]) as rt:
        (ws,) = await _with_notes(rt, agent, key("s1"))
        await rt.sessions.clear(key("s1"))
        assert (ws / "note.txt").exists()
        await rt.sessions.clear(key("s1"), workspace=True)
        assert not ws.exists()
        assert await rt.get_session(key("s1")) is not None  # the session itself stays


async def test_the_sweep_removes_the_workspaces_of_expired_sessions(tmp_path: Path) -> None:
    agent = _agent()
    rt = Runtime(SQLiteStore(tmp_path / "t.db"), data_dir=tmp_path, agents=[agent])
    rt.scheduler.sweep_interval = 0.05
    async with rt:
        await rt.ensure_session(key("brief"), "a", ttl_seconds=0.3)
        await rt.ensure_session(key("long"), "a", ttl_seconds=3600)
        brief, long = await _with_notes(rt, agent, key("brief"), key("long"))
        for _ in range(100):
            if not brief.exists():
                break
            await asyncio.sleep(0.05)
        assert not brief.exists()
        assert await rt.get_session(key("brief")) is None
        assert (long / "note.txt").exists()


async def test_forgetting_a_user_removes_all_their_workspaces(tmp_path: Path) -> None:
    agent = _agent()
    async with Runtime(SQLiteStore(tmp_path / "t.db"), data_dir=tmp_path, agents=[agent]) as rt:
        b1, b2, mine = await _with_notes(rt, agent, key("s1", BOB), key("s2", BOB), key("s1"))
        await rt.forget_user(BOB.tenant, BOB.user)
        assert not b1.exists() and not b2.exists() and not b1.parent.exists()
        assert (mine / "note.txt").exists()


@pytest.mark.parametrize("sid", [".x", "x.."])  # dots alone are refused at every door
async def test_dot_ids_delete_only_their_own_workspace(tmp_path: Path, sid: str) -> None:
    agent = _agent()
    async with Runtime(SQLiteStore(tmp_path / "t.db"), data_dir=tmp_path, agents=[agent]) as rt:
        dot, other = await _with_notes(rt, agent, key(sid), key("plain"))
        await rt.sessions.delete(key(sid))
        assert not dot.exists()
        assert (other / "note.txt").exists()
