"""The app the console's browser tests serve: agents on the fake OpenAI server.

Every agent talks to the fake server whose URL is ``FAKE_OPENAI_URL``: a test scripts what the
model says next (text, tool calls, errors) and how fast it streams, and the console shows what
tether made of it. ``assistant`` may call a tool that needs approval (``launch``), ask the user
(``ask_user``) and hand the conversation to ``helper``; ``noter`` keeps automatic notes.
"""

from __future__ import annotations

import os

from tether import Agent, App, RetryPolicy, tool
from tether.models.openai import OpenAIModel


@tool(requires_approval=True)
def launch(target: str) -> str:
    """Launch something (needs a human's approval)."""
    return f"launched {target}"


def _model() -> OpenAIModel:
    return OpenAIModel("fake-model", base_url=os.environ["FAKE_OPENAI_URL"], api_key="k")


# No retries to speak of: a failing model fails the turn at once.
_RETRY = RetryPolicy(attempts=1, initial_backoff=0.01, max_backoff=0.02)

helper = Agent(
    name="helper",
    instructions="You help with whatever the assistant passes on.",
    model=_model(),
    description="Takes over when the assistant hands a conversation on.",
    retry=_RETRY,
)
assistant = Agent(
    name="assistant",
    instructions="You are a helpful assistant.",
    model=_model(),
    description="Answers, launches things (with approval), asks questions.",
    tools=[launch],
    ask_user=True,
    handoffs=[helper],
    approval_timeout=120,
    retry=_RETRY,
)

# Keeps automatic notes of what the user says about themselves (the memory view marks them).
noter = Agent(
    name="noter",
    instructions="You take notes.",
    model=_model(),
    memory={"auto": True},
    retry=_RETRY,
)

app = App(agents=[assistant, helper, noter])
