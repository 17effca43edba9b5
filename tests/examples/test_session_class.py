"""Sessions seed, "Using the Session Class" and "State Management": a session as an object,
its conversation, its state, and its context — each snippet as the page has it, on the fake
model, with what the page promises checked after it."""

from __future__ import annotations

import pytest

from tests.examples.conftest import Seed, said
from tether import Session

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP


def test_creating_sessions_and_conversation_continuity(seed: Seed) -> None:
    # fmt: off
    # Creating Sessions
    from tether import Session

    # Create a session
    session = Session(
        session_id="chat_123",
        user_id="user_456"
    )

    # Create agent within session context
    agent = session.Agent(
        name="Assistant",
        instructions="You are a helpful assistant"
    )

    # Conversation Continuity
    # First conversation
    response1 = agent.start("My name is John")

    # Later conversation (remembers context)
    response2 = agent.start("What's my name?")
    # Agent responds: "Your name is John"

    # fmt: on
    assert response1 == "echo: My name is John"
    assert response2 == "Your name is John."
    # The context it remembers is the session's history, sent under the agent's instructions.
    assert said(seed.fake.chat_requests[-1]) == [
        ("system", "You are a helpful assistant"),
        ("user", "My name is John"),
        ("assistant", "echo: My name is John"),
        ("user", "What's my name?"),
    ]
    assert (session.session_id, session.user_id) == ("chat_123", "user_456")


def test_state_persistence(seed: Seed) -> None:
    session = Session(session_id="chat_123", user_id="user_456")
    session.Agent(name="Assistant", instructions="You are a helpful assistant")

    # Save custom state
    session.save_state({"topic": "Python", "level": "beginner"})

    # Later, restore state
    state = session.restore_state()
    print(state["topic"])  # "Python"

    assert state == {"topic": "Python", "level": "beginner"}
    # Later is any time: another Session object on the same id (a new process alike) has it.
    assert Session(session_id="chat_123", user_id="user_456").restore_state()["topic"] == "Python"


def test_saving_and_restoring_session_state(seed: Seed) -> None:
    session = Session(session_id="chat_123")
    session.Agent(name="Assistant").chat("We are discussing Python decorators.")

    # Save current state
    session.save_state()

    # State includes:
    # - Session metadata
    # - Memory contents
    # - Knowledge references
    # - Agent configurations
    saved = session.restore_state()["session"]
    assert (saved["session_id"], saved["user_id"]) == ("chat_123", "local")
    assert "metadata" in saved and "memory" in saved
    assert saved["knowledge"] == {"collections": ["knowledge"]}
    assert [(a["name"], a["instructions"]) for a in saved["agents"]] == [
        ("Assistant", "You are a helpful assistant.")
    ]
    session.save_state()  # saving again changes nothing
    assert session.restore_state()["session"] == saved

    # Restoring Session State
    # Create new session instance
    session = Session(session_id="chat_123")

    # Restore previous state
    session.restore_state()

    # Continue where you left off
    agent = session.Agent(name="Assistant")
    response = agent.chat("What were we discussing?")

    assert response == "echo: What were we discussing?"
    assert said(seed.fake.chat_requests[-1])[1:] == [
        ("user", "We are discussing Python decorators."),
        ("assistant", "echo: We are discussing Python decorators."),
        ("user", "What were we discussing?"),
    ]


def test_session_context(seed: Seed, capsys: pytest.CaptureFixture[str]) -> None:
    session = Session(session_id="chat_123", user_id="user_456")
    session.Agent(name="Assistant").chat("Hello")

    # Get session context
    context = session.get_context()
    print(f"Session ID: {context['session_id']}")
    print(f"User ID: {context['user_id']}")
    print(f"Created: {context['created_at']}")
    print(f"Messages: {context['message_count']}")

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Session ID: chat_123"
    assert lines[1] == "User ID: user_456"
    assert lines[2].startswith("Created: ") and float(lines[2].split()[1]) > 0
    assert lines[3] == "Messages: 2"  # the user's message and the reply
    assert context["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "echo: Hello", "agent": "Assistant"},
    ]
