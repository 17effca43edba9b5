"""Tool calls inside a turn: timeouts and cancellation reach the tool, read-only calls run together.

A sync tool runs in a worker thread that Python cannot interrupt; what stops it is its
``ToolContext.cancelled``, which must be set when its call times out or its turn is cancelled.
"""

from __future__ import annotations

import asyncio
import threading
import time

from tests.helpers import all_items, assert_paired, key, running, wait_until
from tether import Agent, ToolContext, tool
from tether.models.base import ModelRequest
from tether.records import ABORTED_TOOL_RESULT
from tether.store.protocol import Store
from tether.testing import Call, ScriptedModel, ToolCalls

WAIT = 20.0
"""Upper bound for waits on another thread; never reached unless the behaviour is broken."""


class Cooperative:
    """A sync tool that works until its context says stop (bounded, so a broken test ends)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stopped = threading.Event()

    def run(self, ctx: ToolContext) -> str:
        self.started.set()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if ctx.cancelled.is_set():
                self.stopped.set()
                return "stopped early"
            time.sleep(0.005)
        return "nobody told me to stop"


def _then(reply: str) -> object:
    def respond(request: ModelRequest) -> str | ToolCalls:
        return reply if request.messages[-1].role == "tool" else ToolCalls(Call("work"))

    return respond


async def test_a_sync_tool_past_its_timeout_is_told_to_stop(store: Store) -> None:
    worker = Cooperative()

    @tool(name="work", timeout=0.05)
    def work(ctx: ToolContext) -> str:
        """Works for a while."""
        return worker.run(ctx)

    model = ScriptedModel(default=_then("gave up"))  # type: ignore[arg-type]
    agent = Agent(name="a", model=model, tools=[work])
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "gave up"
        items = await all_items(rt, key("s"))
        # The thread was told, so it stops instead of running on unseen.
        assert await asyncio.to_thread(worker.stopped.wait, WAIT)
    assert_paired(items)
    result = next(i for i in items if i.kind == "tool_result")
    assert result.meta["error"] is True
    assert "timed out after 0.05 seconds" in result.content
    # Its own call's signal, not the turn's: the turn went on and completed.
    tool_msgs = [m.content for m in model.requests[-1].messages if m.role == "tool"]
    assert tool_msgs == [result.content]


async def test_a_sync_tool_of_a_cancelled_turn_is_told_to_stop(store: Store) -> None:
    worker = Cooperative()

    @tool(name="work")
    def work(ctx: ToolContext) -> str:
        """Works for a while."""
        return worker.run(ctx)

    agent = Agent(name="a", model=ScriptedModel(ToolCalls(Call("work"))), tools=[work])
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        await wait_until(worker.started.is_set, within=WAIT)
        done = await rt.scheduler.cancel(turn.key, turn.id)
        assert done.status == "cancelled"
        assert await asyncio.to_thread(worker.stopped.wait, WAIT)
        items = await all_items(rt, turn.key)
    assert_paired(items)
    assert [i.content for i in items if i.kind == "tool_result"] == [ABORTED_TOOL_RESULT]


async def test_a_tools_own_timeout_error_is_its_error_not_a_timeout(store: Store) -> None:
    @tool(name="work", timeout=60)
    def work() -> str:
        """Talks to something slow."""
        raise TimeoutError("the upstream socket timed out")

    model = ScriptedModel(default=_then("noted"))  # type: ignore[arg-type]
    agent = Agent(name="a", model=model, tools=[work])
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "noted"
        items = await all_items(rt, key("s"))
    result = next(i for i in items if i.kind == "tool_result")
    assert result.content == "Error: work raised TimeoutError: the upstream socket timed out"


class Log:
    """What the tools of one step did, in the order they did it (they may run in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[str] = []

    def add(self, entry: str) -> None:
        with self._lock:
            self.entries.append(entry)


def _calls_then(calls: ToolCalls, reply: str) -> object:
    def respond(request: ModelRequest) -> str | ToolCalls:
        return reply if request.messages[-1].role == "tool" else calls

    return respond


async def test_read_only_calls_of_one_step_run_together_and_others_alone(store: Store) -> None:
    log = Log()
    # The first two read-only calls can only both pass this if they run at the same time.
    meet = threading.Barrier(2, timeout=10)

    @tool(read_only=True)
    def peek(name: str) -> str:
        """Reads something."""
        log.add(f"start {name}")
        if name in ("a", "b"):
            meet.wait()
        log.add(f"end {name}")
        return f"saw {name}"

    @tool
    async def change(name: str) -> str:
        """Changes something."""
        log.add(f"start {name}")
        log.add(f"end {name}")
        return f"changed {name}"

    step = ToolCalls(
        Call("peek", {"name": "a"}),
        Call("peek", {"name": "b"}),
        Call("change", {"name": "w"}),
        Call("peek", {"name": "c"}),
    )
    model = ScriptedModel(default=_calls_then(step, "looked"))  # type: ignore[arg-type]
    agent = Agent(name="a", model=model, tools=[peek, change])
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        done = await rt.scheduler.wait(turn.key, turn.id)
        items = await all_items(rt, turn.key)
        events = await rt.store.list_events(turn.key, turn.id)
    assert done.status == "completed"
    assert_paired(items)
    # Results stay in the order of the calls, in history and in the stream.
    results = [i.content for i in items if i.kind == "tool_result"]
    assert results == ["saw a", "saw b", "changed w", "saw c"]
    assert [e.data["output"] for e in events if e.type == "tool.result"] == results
    # The call with effects waited for the reads before it, and the read after it for it.
    order = log.entries
    assert order.index("start w") > max(order.index("end a"), order.index("end b"))
    assert order.index("start c") > order.index("end w")
