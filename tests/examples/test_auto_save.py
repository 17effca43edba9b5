"""Sessions seed, "Auto-Save Sessions": ``MemoryConfig(auto_save="name")`` persists each
interaction under that name, so a new process with the same config resumes the conversation
with no ``save_state()``; ``MemoryConfig(history=True)`` sends the past messages; the standalone
``Agent(auto_save=...)`` still works, with a DeprecationWarning."""

from __future__ import annotations

import pytest

from tests.examples.conftest import Seed, said
from tether import Agent, Session

AUTO_SAVE = """
from tether import Agent, MemoryConfig

# Automatically save session state under the given name
agent = Agent(
    name="Assistant",
    instructions="You are a helpful assistant.",
    memory=MemoryConfig(
        auto_save="my-assistant-session",  # Session name
        user_id="user123",
    )
)

# Each interaction is auto-persisted
agent.start("Remember that I prefer dark mode")
# Session saved automatically — no manual save_state() needed
"""

RESUMED = """
from tether import Agent, MemoryConfig

agent = Agent(
    name="Assistant",
    instructions="You are a helpful assistant.",
    memory=MemoryConfig(auto_save="my-assistant-session", user_id="user123", history=True),
)
print(agent.start("Which mode do I prefer?"))
"""


@pytest.mark.slow  # real processes
def test_auto_save_is_resumed_by_a_new_process(seed: Seed) -> None:
    seed.run(AUTO_SAVE)
    assert seed.run(RESUMED).strip() == "echo: Which mode do I prefer?"
    assert said(seed.fake.chat_requests[-1]) == [
        ("system", "You are a helpful assistant."),
        ("user", "Remember that I prefer dark mode"),
        ("assistant", "echo: Remember that I prefer dark mode"),
        ("user", "Which mode do I prefer?"),
    ]
    # Saved under that name, as that user's session.
    stored = Session(session_id="my-assistant-session", user_id="user123").get_context()
    assert stored["message_count"] == 4


@pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP
def test_the_standalone_auto_save_is_deprecated_and_still_works(seed: Seed) -> None:
    with pytest.warns(DeprecationWarning, match=r"MemoryConfig\(auto_save"):
        agent = Agent(
            name="Assistant",
            instructions="You are a helpful assistant.",
            auto_save="old-style-session",
        )
    agent.start("Remember that I prefer dark mode")
    again = Agent(
        name="Assistant",
        instructions="You are a helpful assistant.",
        memory={"session_id": "old-style-session"},
    )
    again.start("Which mode do I prefer?")
    assert ("user", "Remember that I prefer dark mode") in said(seed.fake.chat_requests[-1])
