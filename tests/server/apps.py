"""Apps the server tests run in a real ``tether serve`` subprocess.

Models are chosen so outcomes are deterministic: an echo model that shows what it was sent, a
slow streaming model for cancellation, a tool-calling one that needs approval, one whose tool
needs none (``shouter``), one that asks the user (``ask_user``), and an OpenAI provider pointed
at a fake server whose URL comes from ``FAKE_OPENAI_URL``.
"""

from __future__ import annotations

import asyncio
import os
import time

from tether import Agent, App, RetryPolicy, tool
from tether.models.base import ModelRequest
from tether.models.openai import OpenAIModel
from tether.testing import Call, ScriptedModel, Slow, ToolCalls


def digest(request: ModelRequest) -> str:
    """Names every earlier user message the model was shown, then the new one."""
    users = [m.content for m in request.messages if m.role == "user"]
    return f"saw [{', '.join(users[:-1])}] then {users[-1]}"


def slow(request: ModelRequest) -> Slow:
    words = " ".join(f"w{n}" for n in range(40))
    return Slow(words, delay=0.05)


@tool(requires_approval=True)
def launch(target: str) -> str:
    """Launch something (needs a human's approval)."""
    return f"launched {target}"


@tool(requires_approval=True)
def counted_launch(target: str) -> str:
    """Launch something, once per approval: each run is a line in ``LAUNCH_LOG`` (shared by
    every node of a test), so a test can count runs across processes."""
    path = os.environ.get("LAUNCH_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{os.environ.get('TETHER_NODE', '?')} {target} {time.time()}\n")
    return f"launched {target}"


def counted_flow(request: ModelRequest) -> str | ToolCalls:
    last = request.messages[-1]
    if last.role == "tool":
        return f"tool said: {last.content}"
    return ToolCalls(Call("counted_launch", {"target": last.content}))


@tool
def shout(text: str) -> str:
    """Say it louder (runs without asking)."""
    return text.upper()


def shout_flow(request: ModelRequest) -> str | ToolCalls:
    last = request.messages[-1]
    if last.role == "tool":
        return f"it says {last.content}"
    return ToolCalls(Call("shout", {"text": last.content}))


def narrated_flow(request: ModelRequest) -> str | ToolCalls:
    """Says a few words, calls a tool, then answers: a turn of two messages."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"it says {last.content}"
    return ToolCalls(Call("shout", {"text": last.content}), text="Let me shout that.")


def instructions(request: ModelRequest) -> str:
    """Answers with the first line of the system prompt: whose instructions the turn ran."""
    return request.messages[0].content.splitlines()[0]


def system_prompt(request: ModelRequest) -> str:
    """Answers with its whole system prompt: what the turn recalled is visible in the reply."""
    return request.messages[0].content


def approve_flow(request: ModelRequest) -> str | ToolCalls:
    """Launches a rocket (a human approves it), and then a probe too when told "twice": a
    turn that waits for two decisions, one after the other."""
    last = request.messages[-1]
    if last.role == "tool":
        users = [i for i, m in enumerate(request.messages) if m.role == "user"]
        launched = sum(1 for m in request.messages[users[-1] :] if m.role == "tool")
        if "twice" in request.messages[users[-1]].content and launched < 2:
            return ToolCalls(Call("launch", {"target": "probe"}))
        return f"tool said: {last.content}"
    return ToolCalls(Call("launch", {"target": "rocket"}))


@tool
async def ponder(topic: str) -> str:
    """Think a while (a second and a half) before doing anything."""
    await asyncio.sleep(1.5)
    return f"pondered {topic}"


def hesitant_flow(request: ModelRequest) -> str | ToolCalls:
    """Ponders first, then launches (a human approves it): a turn that runs a while before it
    waits for a decision."""
    last = request.messages[-1]
    if last.role != "tool":
        return ToolCalls(Call("ponder", {"topic": "launching"}))
    if last.content.startswith("pondered"):
        return ToolCalls(Call("launch", {"target": "rocket"}))
    return f"tool said: {last.content}"


def ask_flow(request: ModelRequest) -> str | ToolCalls:
    """Asks the user (``ask_user``): to pick a planet when told to pick, else for a name; then
    says what the answer was."""
    if request.messages[-1].role == "tool":
        return f"noted: {request.messages[-1].content}"
    users = [m.content for m in request.messages if m.role == "user"]
    if "pick" in users[-1]:
        return ToolCalls(
            Call("ask_user", {"question": "Which planet?", "choices": ["Mars", "Venus"]})
        )
    return ToolCalls(Call("ask_user", {"question": "What is your name?"}))


agents = [
    Agent(
        name="echo",
        model=ScriptedModel(default=digest, context_window=1_000_000),
        description="Replies with the user messages it saw.",
    ),
    Agent(name="slow", model=ScriptedModel(default=slow)),
    Agent(
        name="approver",
        model=ScriptedModel(default=approve_flow),
        tools=[launch],
        approval_timeout=30,
    ),
    # Asks before each launch and counts launches in LAUNCH_LOG (decisions across nodes).
    Agent(
        name="counter",
        model=ScriptedModel(default=counted_flow),
        tools=[counted_launch],
        approval_timeout=float(os.environ.get("TETHER_TEST_DECISION_TIMEOUT", "120")),
    ),
    # Two agents of one app that may share a session; each answers with its own instructions.
    Agent(
        name="researcher",
        instructions="You research topics.",
        model=ScriptedModel(default=instructions),
    ),
    Agent(
        name="writer", instructions="You write articles.", model=ScriptedModel(default=instructions)
    ),
    # Keeps automatic notes (whatever the model) and shows what it recalled.
    Agent(
        name="recaller",
        instructions="You recall.",
        model=ScriptedModel(default=system_prompt),
        memory={"auto": True},
    ),
    # Asks the user a question (the built-in ask_user tool).
    Agent(name="asker", model=ScriptedModel(default=ask_flow), ask_user=True, approval_timeout=30),
    # Short steady turns (~0.2 s): load that spans an outage.
    Agent(name="steady", model=ScriptedModel(default=Slow("s " * 10, delay=0.02))),
    # Calls a tool that needs no approval, then answers with what it returned.
    Agent(name="shouter", model=ScriptedModel(default=shout_flow), tools=[shout]),
    # Says something before it calls a tool, then answers: two messages in one turn.
    Agent(name="narrator", model=ScriptedModel(default=narrated_flow), tools=[shout]),
    # Runs 1.5 s (a tool), then waits for a human's approval.
    Agent(
        name="hesitant",
        model=ScriptedModel(default=hesitant_flow),
        tools=[ponder, launch],
        approval_timeout=30,
    ),
]
if os.environ.get("FAKE_OPENAI_URL"):
    agents.append(
        Agent(
            name="upstream",
            model=OpenAIModel("fake-model", base_url=os.environ["FAKE_OPENAI_URL"], api_key="k"),
            retry=RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02),
        )
    )

app = App(agents=agents)
