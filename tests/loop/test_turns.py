"""Turn outcomes (DESIGN §3) on every store: continuity, cancel, failure, tools, limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import pytest

from tests.helpers import all_items, assert_paired, key, running, wait_until
from tether import Agent, ConfigError, RetryPolicy, SessionBusy, TurnFailed, tool
from tether.loop.window import INTERRUPTED_MARK
from tether.models.base import ModelRequest
from tether.records import ABORTED_TOOL_RESULT, Policy, Turn
from tether.runtime import Runtime
from tether.store.protocol import Store
from tether.testing import Call, EchoModel, Fail, ScriptedModel, Slow, ToolCalls, transcript

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.002)


async def test_second_turn_sees_first_turn_in_order(store: Store) -> None:
    model = ScriptedModel("Hello Ada!", "You said your name is Ada.")
    # History alone (automatic notes would also put the name in the system prompt).
    agent = Agent(name="a", model=model, instructions="be brief", memory={"auto": False})
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "my name is Ada", session_id="s") == "Hello Ada!"
        assert await rt.chat(agent, "what is my name?", session_id="s") == (
            "You said your name is Ada."
        )
    second = model.requests[1]
    assert transcript(second.messages) == [
        ("system", "be brief"),
        ("user", "my name is Ada"),
        ("assistant", "Hello Ada!"),
        ("user", "what is my name?"),
    ]


async def test_reject_while_running_names_busy_turn_and_stores_nothing(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(Slow("slow reply here", delay=0.05)))
    async with running(store, agent) as rt:
        first = await rt.submit(agent, "one", session_id="s")
        await wait_until(lambda: bool(rt.scheduler.running_turns()))
        with pytest.raises(SessionBusy) as info:
            await rt.submit(agent, "two", session_id="s", policy="reject")
        assert info.value.busy_turn_id == first.id
        done = await rt.scheduler.wait(first.key, first.id)
        assert done.status == "completed"
        turns = await rt.store.list_turns(first.key)
        assert [t.id for t in turns] == [first.id]
        items = await all_items(rt, first.key)
        assert [i.content for i in items if i.kind == "user"] == ["one"]


async def test_reject_while_queued(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(Slow(delay=0.05), "two done"))
    async with running(store, agent) as rt:
        await rt.submit(agent, "one", session_id="s")
        queued = await rt.submit(agent, "two", session_id="s")
        with pytest.raises(SessionBusy):
            await rt.submit(agent, "three", session_id="s", policy="reject")
        await rt.scheduler.wait(queued.key, queued.id)
        assert len(await rt.store.list_turns(queued.key)) == 2


async def test_cancel_mid_stream_keeps_partial_reply_flagged(store: Store) -> None:
    model = EchoModel()
    model.script(Slow("partial words that keep on coming", delay=0.02, forever=True))
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "tell me a long story", session_id="s")
        seen: list[str] = []
        async for event in rt.scheduler.events(turn.key, turn.id):
            if event.type == "message.delta":
                seen.append(event.data["text"])
                if len(seen) == 3:
                    await rt.scheduler.cancel(turn.key, turn.id)
        done = await rt.scheduler.wait(turn.key, turn.id)
        assert done.status == "cancelled"
        assert done.complete is False
        assert done.output is not None and done.output.startswith("".join(seen))

        events = await rt.store.list_events(turn.key, turn.id)
        assert [e.type for e in events].count("turn.ended") == 1
        assert events[-1].type == "turn.ended"
        assert events[-1].data["status"] == "cancelled"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))

        items = await all_items(rt, turn.key)
        partial = [i for i in items if i.kind == "assistant"]
        assert len(partial) == 1 and partial[0].complete is False

        reply = await rt.chat(agent, "and now?", session_id="s")
        assert "and now?" in reply
    prompt = transcript(model.requests[-1].messages)
    assistant = [c for r, c in prompt if r == "assistant"]
    assert len(assistant) == 1 and assistant[0].endswith(INTERRUPTED_MARK)


async def test_end_waiting_turn(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(Slow(delay=0.05)))
    async with running(store, agent) as rt:
        first = await rt.submit(agent, "one", session_id="s")
        second = await rt.submit(agent, "two", session_id="s")
        cancelled = await rt.scheduler.cancel(second.key, second.id)
        assert cancelled.status == "cancelled"
        assert (await rt.scheduler.wait(first.key, first.id)).status == "completed"
        items = await all_items(rt, first.key)
        assert [i.content for i in items if i.kind == "user"] == ["one"]
        events = await rt.store.list_events(second.key, second.id)
        assert [e.type for e in events] == ["turn.queued", "turn.ended"]


async def test_transient_errors_are_retried(store: Store) -> None:
    model = ScriptedModel(Fail("HTTP 429", status=429), Fail("HTTP 503"), "finally")
    agent = Agent(name="a", model=model, retry=FAST_RETRY)
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "hi", session_id="s") == "finally"
    assert len(model.requests) == 3


async def test_model_failure_after_retries_is_failed_and_hidden_later(store: Store) -> None:
    model = EchoModel()
    model.script("first answer", *[Fail("upstream exploded 500")] * 3)
    agent = Agent(name="a", model=model, retry=FAST_RETRY)
    async with running(store, agent) as rt:
        await rt.chat(agent, "one", session_id="s")
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "doomed question", session_id="s")
        turn = info.value.turn
        assert turn.status == "failed" and turn.reason == "model_error"
        assert turn.error is not None and "upstream exploded" in turn.error
        await rt.chat(agent, "three", session_id="s")
        items = await all_items(rt, key("s"))
        doomed = [i for i in items if i.turn_id == turn.id]
        assert doomed and all(i.excluded for i in doomed)
    last = " ".join(c for _, c in transcript(model.requests[-1].messages))
    assert "doomed question" not in last
    assert "exploded" not in last
    assert "first answer" in last


async def test_non_transient_error_is_not_retried(store: Store) -> None:
    model = ScriptedModel(Fail("bad request", transient=False, status=400))
    agent = Agent(name="a", model=model, retry=FAST_RETRY)
    async with running(store, agent) as rt:
        with pytest.raises(TurnFailed):
            await rt.chat(agent, "hi", session_id="s")
    assert len(model.requests) == 1


@tool
def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"kaboom: {reason}")


async def test_raising_tool_becomes_result_the_model_sees(store: Store) -> None:
    model = ScriptedModel(ToolCalls(Call("explode", {"reason": "test"})), "recovered")
    agent = Agent(name="a", model=model, tools=[explode])
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "recovered"
        items = await all_items(rt, key("s"))
    assert_paired(items)
    result = next(i for i in items if i.kind == "tool_result")
    assert "kaboom: test" in result.content and result.meta["error"] is True
    tool_msg = [m for m in model.requests[1].messages if m.role == "tool"]
    assert len(tool_msg) == 1 and "kaboom" in tool_msg[0].content


hang_started = threading.Event()


@tool
async def hang() -> str:
    """Never returns."""
    hang_started.set()
    await asyncio.sleep(3600)
    return "unreachable"


async def test_cancelled_hanging_tool_gets_aborted_result(store: Store) -> None:
    hang_started.clear()
    model = ScriptedModel(ToolCalls(Call("hang"), Call("hang", {})), "next turn reply")
    agent = Agent(name="a", model=model, tools=[hang])
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        await wait_until(hang_started.is_set)
        done = await rt.scheduler.cancel(turn.key, turn.id)
        assert done.status == "cancelled"
        items = await all_items(rt, turn.key)
        assert_paired(items)
        results = [i for i in items if i.kind == "tool_result"]
        assert len(results) == 2 and all(r.content == ABORTED_TOOL_RESULT for r in results)
        assert await rt.chat(agent, "again", session_id="s") == "next turn reply"
    # The next prompt carries both calls and both aborted results, in OpenAI's required order.
    roles = [m.role for m in model.requests[-1].messages]
    assert roles == ["system", "user", "assistant", "tool", "tool", "user"]


@tool
def slow_sync(seconds: float) -> str:
    """Sleeps in a thread."""
    import time

    time.sleep(seconds)
    return "slept"


async def test_tool_timeout_is_reported_to_model(store: Store) -> None:
    model = ScriptedModel(ToolCalls(Call("slow_sync", {"seconds": 2})), "ok")
    agent = Agent(name="a", model=model, tools=[slow_sync], tool_timeout=0.1)
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "ok"
        items = await all_items(rt, key("s"))
    assert_paired(items)
    assert "timed out after 0.1 seconds" in items[2].content


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"nothing about {q}"


async def test_three_identical_calls_stop_the_loop(store: Store) -> None:
    same = ToolCalls(Call("lookup", {"q": "x"}))
    model = ScriptedModel(default=same)
    agent = Agent(name="a", model=model, tools=[lookup], max_iterations=10)
    async with running(store, agent) as rt:
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "go", session_id="s")
        items = await all_items(rt, key("s"))
    assert (info.value.turn.status, info.value.turn.reason) == ("limit_reached", "loop")
    assert len(model.requests) == 3
    assert_paired(items)
    executed = [i for i in items if i.kind == "tool_result" and i.content.startswith("nothing")]
    assert len(executed) == 2


async def test_max_iterations(store: Store) -> None:
    counter = iter(range(100))
    model = ScriptedModel(default=lambda _r: ToolCalls(Call("lookup", {"q": str(next(counter))})))
    agent = Agent(name="a", model=model, tools=[lookup], max_iterations=4)
    async with running(store, agent) as rt:
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "go", session_id="s")
        items = await all_items(rt, key("s"))
    assert (info.value.turn.status, info.value.turn.reason) == ("limit_reached", "max_iterations")
    assert len(model.requests) == 4
    assert_paired(items)
    assert len([i for i in items if i.kind == "tool_call"]) == 4


async def test_finish_at_the_limit_answers_without_tools_and_says_so(store: Store) -> None:
    # Calls a tool whenever it is offered one; answers only when it is not.
    counter = iter(range(100))

    def script(request: ModelRequest) -> str | ToolCalls:
        if not request.tools:
            return "here is what I found"
        return ToolCalls(Call("lookup", {"q": str(next(counter))}))

    model = ScriptedModel(default=script)
    agent = Agent(
        name="a", model=model, tools=[lookup], max_iterations=3, on_max_iterations="finish"
    )
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "here is what I found"
        [turn] = await rt.store.list_turns(key("s"))
        items = await all_items(rt, key("s"))
    assert (turn.status, turn.reason) == ("completed", "finished_at_limit")
    assert len(model.requests) == 4 and model.requests[-1].tools == ()
    assert model.requests[-1].messages[-1].role == "system"  # told to answer with what it has
    assert_paired(items)
    assert [i.kind for i in items][-1] == "assistant" and items[-1].complete


async def test_finish_with_a_model_that_still_wants_tools_is_limit_reached(store: Store) -> None:
    model = ScriptedModel(default=lambda _r: ToolCalls(Call("lookup", {"q": "again"})))
    agent = Agent(
        name="a", model=model, tools=[lookup], max_iterations=1, on_max_iterations="finish"
    )
    async with running(store, agent) as rt:
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "go", session_id="s")
        items = await all_items(rt, key("s"))
    assert (info.value.turn.status, info.value.turn.reason) == ("limit_reached", "max_iterations")
    assert_paired(items)  # the unoffered call was never stored, so nothing is left unpaired


def test_on_max_iterations_is_checked() -> None:
    with pytest.raises(ConfigError):
        Agent(name="a", on_max_iterations="continue")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Agent(name="a", max_iterations=5, on_max_iterations="ask", max_total_iterations=3)
    assert Agent(name="a", max_iterations=5, on_max_iterations="ask").total_iterations == 20


async def test_token_budget(store: Store) -> None:
    model = ScriptedModel(default=ToolCalls(Call("lookup", {"q": "a"}), Call("lookup", {"q": "b"})))
    agent = Agent(name="a", model=model, tools=[lookup], token_budget=1)
    async with running(store, agent) as rt:
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "go", session_id="s")
        assert_paired(await all_items(rt, key("s")))
    assert info.value.turn.reason == "token_budget"


async def test_unknown_tool_and_bad_arguments_are_results(store: Store) -> None:
    model = ScriptedModel(ToolCalls(Call("nope", {}), Call("lookup", {"wrong": 1})), "fine")
    agent = Agent(name="a", model=model, tools=[lookup])
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "go", session_id="s") == "fine"
        items = await all_items(rt, key("s"))
    assert_paired(items)
    results = [i.content for i in items if i.kind == "tool_result"]
    assert "no tool named 'nope'" in results[0]
    assert "invalid arguments for lookup" in results[1]


@tool(requires_approval=True)
def delete_everything() -> str:
    """Dangerous."""
    raise AssertionError("must never run without approval")


async def test_approval_fails_closed_without_approver(store: Store) -> None:
    model = ScriptedModel(ToolCalls(Call("delete_everything")), "ok")
    agent = Agent(name="a", model=model, tools=[delete_everything], approval_timeout=0.1)
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        done = await rt.scheduler.wait(turn.key, turn.id)  # nobody decides: the deadline does
        events = await rt.store.list_events(turn.key, turn.id)
        items = await all_items(rt, turn.key)
    assert done.status == "completed"
    types = [e.type for e in events]
    assert "decision.requested" in types
    made = next(e for e in events if e.type == "decision.made")
    assert made.data["status"] == "expired"
    assert "refused" in next(i for i in items if i.kind == "tool_result").content


async def test_events_follow_the_design_order(store: Store) -> None:
    model = ScriptedModel(ToolCalls(Call("lookup", {"q": "z"}), text="let me check"), "all done")
    agent = Agent(name="a", model=model, tools=[lookup])
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        live = [e async for e in rt.scheduler.events(turn.key, turn.id)]
        stored = await rt.store.list_events(turn.key, turn.id)
    assert [(e.seq, e.type) for e in live] == [(e.seq, e.type) for e in stored]
    types = [e.type for e in stored]
    assert types[0] == "turn.queued" and types[1] == "turn.started"
    assert types[-1] == "turn.ended" and types.count("turn.ended") == 1
    assert types.index("tool.call") < types.index("tool.result")
    assert stored[-1].data["status"] == "completed" and stored[-1].data["output"] == "all done"
    call = next(e for e in stored if e.type == "tool.call")
    assert json.loads(call.data["arguments"]) == {"q": "z"}


async def streamed(rt: Runtime, turn: Turn) -> None:
    """Return once ``turn`` has streamed the first piece of its reply."""
    events = rt.scheduler.events(turn.key, turn.id)
    async with asyncio.timeout(10), contextlib.aclosing(events) as stream:
        async for event in stream:
            if event.type == "message.delta":
                return
    raise AssertionError("the turn ended without streaming anything")


async def test_interrupt_policy_ends_running_turn(store: Store) -> None:
    model = ScriptedModel(Slow("a b c d e f g h", delay=0.05, forever=True), "new answer")
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        first = await rt.submit(agent, "long", session_id="s")
        await streamed(rt, first)  # a partial reply exists to be kept (or removed)
        second = await rt.submit(agent, "stop that", session_id="s", policy="interrupt")
        one = await rt.scheduler.wait(first.key, first.id)
        two = await rt.scheduler.wait(second.key, second.id)
        items = await all_items(rt, first.key)
    assert one.status == "interrupted" and one.complete is False
    # The call it cut short was made: it counts (its usage was all zeros before).
    assert one.usage.model_calls == 1
    assert two.status == "completed"
    assert [(i.kind, i.complete) for i in items] == [
        ("user", True),
        ("assistant", False),
        ("user", True),
        ("assistant", True),
    ]


async def test_rollback_policy_removes_running_turns_items(store: Store) -> None:
    model = ScriptedModel(Slow("a b c d e f g h", delay=0.05, forever=True), "new answer")
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        first = await rt.submit(agent, "long", session_id="s")
        await streamed(rt, first)  # a partial reply exists to be kept (or removed)
        second = await rt.submit(agent, "instead", session_id="s", policy="rollback")
        one = await rt.scheduler.wait(first.key, first.id)
        await rt.scheduler.wait(second.key, second.id)
        items = await all_items(rt, first.key)
    assert one.status == "rolled_back"
    assert [i.content for i in items] == ["instead", "new answer"]
    assert "long" not in " ".join(c for _, c in transcript(model.requests[-1].messages))


@pytest.mark.parametrize(
    ("policy", "status"), [("interrupt", "interrupted"), ("rollback", "rolled_back")]
)
async def test_a_turn_that_interrupts_runs_next_before_turns_queued_earlier(
    store: Store, policy: Policy, status: str
) -> None:
    # Before, the turns queued between ran first, then the new one (DESIGN §4: "the new turn
    # runs next"); now they end cancelled, with the policy as reason, never having run.
    model = ScriptedModel(Slow("a b c d e f g h", delay=0.05, forever=True), default="answer")
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        first = await rt.submit(agent, "long", session_id="s")
        await streamed(rt, first)
        queued = [await rt.submit(agent, f"queued {n}", session_id="s") for n in range(2)]
        newer = await rt.submit(agent, "this instead", session_id="s", policy=policy)
        done = await rt.scheduler.wait(newer.key, newer.id)
        one = await rt.scheduler.wait(first.key, first.id)
        between = [await rt.scheduler.wait(t.key, t.id) for t in queued]
        items = await all_items(rt, first.key)
    assert (one.status, one.reason) == (status, policy)
    assert [(t.status, t.reason, t.started_at) for t in between] == [
        ("cancelled", policy, None)
    ] * 2
    assert done.status == "completed"
    # The model heard the long turn, then the new one: the queued ones never reached it.
    said = [m.content for r in model.requests for m in r.messages if m.role == "user"]
    assert not any("queued" in str(c) for c in said)
    assert [i.content for i in items if i.kind == "user"] == (
        ["long", "this instead"] if policy == "interrupt" else ["this instead"]
    )


async def test_streamed_events_reach_the_store_while_the_reply_streams(store: Store) -> None:
    """A follower in another process reads the store: it must see a long reply come in."""
    model = ScriptedModel(Slow(" ".join(f"w{n}" for n in range(60)), delay=0.02))
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        seen_live: list[int] = []
        async with asyncio.timeout(10):
            while not seen_live:
                current = await rt.store.get_turn(turn.key, turn.id)
                assert current is not None
                stored = await rt.store.list_events(turn.key, turn.id)
                deltas = [e.seq for e in stored if e.type == "message.delta"]
                if deltas and current.status == "running":
                    seen_live = deltas
                elif current.ended:
                    raise AssertionError("no delta was stored before the turn ended")
                await asyncio.sleep(0.02)
        done = await rt.scheduler.wait(turn.key, turn.id)
        events = await rt.store.list_events(turn.key, turn.id)
    assert done.status == "completed"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.type for e in events].count("turn.ended") == 1
