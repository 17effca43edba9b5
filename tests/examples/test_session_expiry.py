"""Sessions seed, "Session Expiry & Cleanup": the snippet, its three tabs, and the table's
promises — a negative TTL is a ValueError at once, ``time_to_expiry`` never goes below 0, an
expired session refuses turns, and ``close()`` ends the object while the conversation stays."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest

import tether.session
from tests.examples.conftest import Seed
from tether import Session, SessionClosed, SessionNotFound

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP


def test_expiry_and_cleanup(seed: Seed, capsys: pytest.CaptureFixture[str]) -> None:
    from tether import Session

    # Session expires 1 hour after creation
    session = Session(
        session_id="chat_123",
        session_ttl=3600,
    )

    agent = session.Agent(
        name="Assistant",
        instructions="You are a helpful assistant",
    )

    agent.start("Hello!")

    # Later — gate on expiry before answering
    if session.is_expired():
        print("Session expired, please start a new one")
    else:
        agent.start("Continue our chat")

    remaining = session.time_to_expiry()
    # Always release resources when done
    session.close()

    assert "expired" not in capsys.readouterr().out
    assert [r["messages"][-1]["content"] for r in seed.fake.chat_requests] == [
        "Hello!",
        "Continue our chat",
    ]
    assert remaining is not None and 3590 < remaining <= 3600
    with pytest.raises(SessionClosed):
        session.is_expired()
    # Closed is this object: the conversation stays stored, with its expiry.
    again = Session(session_id="chat_123")
    assert again.get_context()["message_count"] == 4
    assert not again.is_expired()


def test_a_negative_ttl_is_a_value_error_at_once(seed: Seed) -> None:
    with pytest.raises(ValueError, match="session_ttl"):
        Session(session_id="chat_123", session_ttl=-1)
    assert Session(session_id="chat_123").time_to_expiry() is None  # None: never expires
    assert not Session(session_id="chat_123").is_expired()


def test_an_expired_session_has_no_time_left_and_refuses_turns(seed: Seed) -> None:
    session = Session(session_id="short", session_ttl=0.5)
    agent = session.Agent(name="Assistant")
    agent.start("Hello!")
    deadline = time.monotonic() + 30
    while not session.is_expired():  # the store's clock decides; wait for it to pass
        assert time.monotonic() < deadline, "the session never expired"
        time.sleep(0.05)
    assert session.time_to_expiry() == 0.0  # clamped: never below 0
    with pytest.raises(SessionNotFound, match="expired"):
        agent.start("Still there?")
    with pytest.raises(SessionNotFound, match="expired"):
        session.chat("Still there?")
    assert len(seed.fake.chat_requests) == 1  # the model was never asked again


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """Moves the clock a Session reads its expiry by (only that one) forward."""
    ahead = [0.0]
    moved = SimpleNamespace(time=lambda: time.time() + ahead[0])
    monkeypatch.setattr(tether.session, "time", moved)

    def forward(seconds: float) -> None:
        ahead[0] += seconds

    return forward


def test_tab_poll_before_each_turn(
    seed: Seed,
    clock: Callable[[float], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines: Iterator[str] = iter(["Hello", "Are you there?"])

    def user_types(prompt: str) -> str:
        line = next(lines, None)
        if line is None:
            raise AssertionError("asked for input after the session expired")
        if line == "Are you there?":
            clock(1801)  # the user answers half an hour later
        return line

    monkeypatch.setattr("builtins.input", user_types)

    session = Session(session_id="chat", session_ttl=1800)
    agent = session.Agent(name="Assistant")

    while True:
        if session.is_expired():
            print("Session expired")
            session.close()
            break
        user_input = input("You: ")
        print(agent.start(user_input))

    assert capsys.readouterr().out.splitlines() == [
        "echo: Hello",
        "echo: Are you there?",
        "Session expired",
    ]
    with pytest.raises(SessionClosed):
        session.chat("hi")


def test_tab_show_remaining_time(seed: Seed, capsys: pytest.CaptureFixture[str]) -> None:
    session = Session(session_id="chat", session_ttl=1800)
    session.Agent(name="Assistant").start("Hello")

    remaining = session.time_to_expiry()
    if remaining is not None:
        print(f"{int(remaining)}s left in this session")

    found = re.fullmatch(r"(\d+)s left in this session\n", capsys.readouterr().out)
    assert found is not None and 1790 <= int(found.group(1)) <= 1800


def test_tab_cleanup_with_close(seed: Seed) -> None:
    session = Session(session_id="chat", session_ttl=600)
    try:
        agent = session.Agent(name="Assistant")
        agent.start("Quick question")
    finally:
        session.close()

    with pytest.raises(SessionClosed):
        session.get_context()
    session.close()  # closing again does nothing
    stored = Session(session_id="chat").get_context()
    assert [m["content"] for m in stored["messages"]] == ["Quick question", "echo: Quick question"]
