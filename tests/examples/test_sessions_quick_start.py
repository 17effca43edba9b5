"""Sessions seed, "Quick Start with Agent": a process says its name, a new process resumes.

The snippet as the page has it, cut where its comment says "Later, in a new process": each half
runs in a process of its own (the second with the page's import line), on the fake model.
"""

from __future__ import annotations

import pytest

from tests.examples.conftest import Seed, said
from tether import Session

pytestmark = pytest.mark.slow  # real processes

QUICK_START = """
from tether import Agent

# Create agent with session persistence
agent = Agent(
    name="Assistant",
    instructions="You are a helpful assistant",
    memory={"session_id": "my-session-123"}
)

# First conversation
agent.start("My name is Alice")

# Later, in a new process - history restored automatically!
agent = Agent(
    name="Assistant",
    instructions="You are a helpful assistant",
    memory={"session_id": "my-session-123"}
)
agent.start("What's my name?")  # Remembers: "Alice"
"""


def test_a_new_process_resumes_the_conversation(seed: Seed) -> None:
    first, later = QUICK_START.split("# Later, in a new process")
    seed.run(first)
    seed.run("from tether import Agent\n#" + later)
    # It remembers because the history was restored: the new process sent the first exchange.
    assert said(seed.fake.chat_requests[-1]) == [
        ("system", "You are a helpful assistant"),
        ("user", "My name is Alice"),
        ("assistant", "echo: My name is Alice"),
        ("user", "What's my name?"),
    ]
    # What both processes stored, in order: the second answer names Alice.
    context = Session(session_id="my-session-123").get_context()
    assert [(m["role"], m["content"]) for m in context["messages"]] == [
        ("user", "My name is Alice"),
        ("assistant", "echo: My name is Alice"),
        ("user", "What's my name?"),
        ("assistant", "Your name is Alice."),
    ]
