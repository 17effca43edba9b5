"""The Session facade (DESIGN §10): embedded sessions with state and TTL, and remote ones."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import Agent, Session, SessionNotFound
from tether.testing import EchoModel, ScriptedModel


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def test_session_agent_persists_state_and_context(data_dir: Path) -> None:
    session = Session(session_id="chat_123", user_id="user_456", session_ttl=3600)
    helper = session.Agent(name="Assistant", instructions="be brief", model=EchoModel())
    assert helper.chat("hello") == "user:hello"
    assert helper.chat("again") == "user:hello | assistant:user:hello | user:again"
    assert session.get_context() == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "user:hello"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "user:hello | assistant:user:hello | user:again"},
    ]
    session.save_state({"step": 2, "topic": "greetings"})
    assert Session(session_id="chat_123", user_id="user_456").restore_state() == {
        "step": 2,
        "topic": "greetings",
    }
    remaining = session.time_to_expiry()
    assert remaining is not None and 3590 < remaining <= 3600
    assert not session.is_expired()
    # Another user's session with the same id is another conversation.
    other = Session(session_id="chat_123", user_id="someone_else")
    assert other.get_context() == [] and other.restore_state() == {}
    session.close()


def test_expired_session_refuses_turns(data_dir: Path) -> None:
    session = Session(session_id="short", session_ttl=0.2)
    session.Agent(name="A", model=EchoModel())
    session.chat("first")
    time.sleep(0.3)
    assert session.is_expired()
    with pytest.raises(SessionNotFound):
        session.chat("too late")


async def test_astream_yields_events_until_the_end(data_dir: Path) -> None:
    agent = Agent(name="s", model=ScriptedModel("one two three"))
    events = [e async for e in agent.astream("go")]
    types = [e.type for e in events]
    assert types[0] == "turn.queued" and types[-1] == "turn.ended"
    assert "".join(e.data["text"] for e in events if e.type == "message.delta") == ("one two three")
    assert events[-1].data["status"] == "completed"


def test_memory_and_knowledge_as_the_first_calls_of_a_process(
    data_dir: Path, tmp_path: Path
) -> None:
    session = Session(session_id="first-1", user_id="u-first")
    # Each of these may be the very first thing a program does: the store opens on demand.
    assert Session(session_id="k", user_id="u-first").search_knowledge("vacation") == []
    handbook = tmp_path / "handbook.md"
    handbook.write_text("# Leave\n\nStaff get 27 days of paid leave.\n")
    assert session.add_knowledge(handbook)["chunks"] == 1
    item = session.add_memory("The user prefers metric units.")
    assert item.startswith("mem_")
    found = Session(session_id="other", user_id="u-first").search_memory("units")
    assert [h["content"] for h in found] == ["The user prefers metric units."]
    hits = session.search_knowledge("paid leave days")
    assert "27 days" in hits[0]["content"]
    # A mistyped file name is an error, not a one-line document; text is indexed as text.
    with pytest.raises(FileNotFoundError):
        session.add_knowledge("handbok.md")
    with pytest.raises(FileNotFoundError):
        session.add_knowledge("docs/handbok")
    assert session.add_knowledge("Meals and/or taxis are reimbursed.")["name"] == "text"
    # Another user sees none of it.
    stranger = Session(session_id="first-1", user_id="someone-else")
    assert stranger.search_memory("units") == []
    assert stranger.search_knowledge("paid leave days") == []
