"""Human decisions through the runtime (DESIGN §3 ``awaiting_input``, §7; issue 11).

A turn that needs a human parks: the decision is a row in the store, the turn holds no lease and
no task, the session's later turns wait behind it (or follow their policy), and a decision made
later — or its deadline passing — lets the turn go on from its stored items. Every backend.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import StoreFactory, all_items, assert_paired, key, wait_until
from tether import Agent, tool
from tether.errors import (
    DecisionMade,
    DecisionNotFound,
    DecisionRequired,
    SessionBusy,
)
from tether.events import (
    DECISION_MADE,
    DECISION_REQUESTED,
    TOOL_STARTED,
    TURN_AWAITING_INPUT,
    TURN_ENDED,
    TURN_RESUMED,
)
from tether.models.base import ModelRequest
from tether.records import LOCAL_PRINCIPAL, Decision, Policy, SessionKey, Turn
from tether.runtime import DecisionAnswer, Runtime
from tether.store import InMemoryStore
from tether.store.protocol import Store
from tether.store.rules import ALWAYS_KEY
from tether.testing import Call, ScriptedModel, Slow, ToolCalls
from tether.testing.scripted import Response, last_user_text
from tether.tools.approval import EXPIRED_RESULT, REFUSED_RESULT

launched: list[str] = []


@tool(requires_approval=True)
def launch(target: str) -> str:
    """Launch something (a human approves each launch)."""
    launched.append(target)
    return f"launched {target}"


def _launcher(request: ModelRequest) -> str | ToolCalls:
    """Launches once per user message, then reports what the tool said."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"tool said: {last.content}"
    return ToolCalls(Call("launch", {"target": last.content}))


def _agent(**kw: object) -> Agent:
    return Agent(name="launcher", model=ScriptedModel(default=_launcher), tools=[launch], **kw)  # type: ignore[arg-type]


async def _parked(rt: Runtime, agent: Agent, text: str = "rocket", sid: str = "s") -> Turn:
    turn = await rt.submit(agent, text, session_id=sid)
    parked = await rt.scheduler.wait(turn.key, turn.id, until_input=True)
    assert parked.status == "awaiting_input", parked
    return parked


async def _pending(rt: Runtime, turn: Turn) -> Decision:
    [d] = await rt.decisions(turn.key, turn_id=turn.id, status="pending")
    return d


@pytest.fixture(autouse=True)
def _fresh() -> None:
    launched.clear()


async def test_a_parked_turn_holds_no_lease_and_resumes_on_decision(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 0  # so "no lease held" is checked at once, not after a linger
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
        assert (d.kind, d.payload["tool"], d.call_id) == ("approval", "launch", d.call_id)
        assert '"rocket"' in d.payload["arguments"]
        await wait_until(lambda: parked.key not in rt.scheduler.local.workers)
        assert rt.scheduler.lease_of(parked.key) is None
        assert await rt.store.lease_holder(parked.key) is None
        assert rt.scheduler.running_turns() == []
        assert launched == []

        made = await rt.decide(parked.key, parked.id, d.call_id, "approve")
        assert made.status == "approved" and made.decided_by == "local"
        done = await rt.scheduler.wait(parked.key, parked.id)
        assert (done.status, done.output) == ("completed", "tool said: launched rocket")
        assert launched == ["rocket"]  # exactly once
        items = await all_items(rt, parked.key)
        assert [i.kind for i in items] == ["user", "tool_call", "tool_result", "assistant"]
        assert_paired(items)
        types = [e.type for e in await rt.store.list_events(parked.key, parked.id)]
        order = [
            DECISION_REQUESTED,
            TURN_AWAITING_INPUT,
            DECISION_MADE,
            TURN_RESUMED,
            TOOL_STARTED,
            TURN_ENDED,
        ]
        assert [t for t in types if t in order] == order
        seqs = [e.seq for e in await rt.store.list_events(parked.key, parked.id)]
        assert seqs == list(range(1, len(seqs) + 1))
        assert done.usage.model_calls == 2  # the usage of both halves of the turn


async def test_other_sessions_run_at_full_speed_while_one_waits(store: Store) -> None:
    agent = _agent()
    chatty = Agent(name="chatty", model=ScriptedModel(default="hi"))
    async with Runtime(store, agents=[agent, chatty]) as rt:
        parked = await _parked(rt, agent)
        answers = await asyncio.gather(
            *(rt.chat(chatty, f"n{n}", session_id=f"other-{n}") for n in range(20))
        )
        assert answers == ["hi"] * 20
        turn = await rt.store.get_turn(parked.key, parked.id)
        assert turn is not None and turn.status == "awaiting_input"  # still waiting, untouched


async def test_later_turns_wait_behind_a_parked_one_or_follow_their_policy(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        with pytest.raises(SessionBusy) as busy:
            await rt.submit(agent, "again", session_id="s", policy="reject")
        assert busy.value.busy_turn_id == parked.id
        behind = await rt.submit(agent, "satellite", session_id="s")
        await asyncio.sleep(0.3)
        waiting = await rt.store.get_turn(behind.key, behind.id)
        assert waiting is not None and waiting.status == "queued"  # behind, not run
        d = await _pending(rt, parked)
        await rt.decide(parked.key, parked.id, d.call_id, "deny")
        first = await rt.scheduler.wait(parked.key, parked.id)
        assert first.output == f"tool said: {REFUSED_RESULT}"
        second = await rt.scheduler.wait(behind.key, behind.id, until_input=True)
        assert second.status == "awaiting_input"  # then it asks for its own launch
        assert launched == []


@pytest.mark.parametrize(
    ("policy", "status"), [("interrupt", "interrupted"), ("rollback", "rolled_back")]
)
async def test_interrupt_and_rollback_end_a_parked_turn(
    store: Store, policy: str, status: str
) -> None:
    agent = _agent()
    plain = Agent(name="plain", model=ScriptedModel(default="fine"))
    async with Runtime(store, agents=[agent, plain]) as rt:
        parked = await _parked(rt, agent)
        newer = await rt.submit(plain, "never mind", session_id="s", policy=policy)  # type: ignore[arg-type]
        done = await rt.scheduler.wait(newer.key, newer.id)
        assert done.output == "fine"
        old = await rt.store.get_turn(parked.key, parked.id)
        assert old is not None and (old.status, old.reason) == (status, policy)
        items = await all_items(rt, parked.key)
        assert_paired(items)
        [d] = await rt.decisions(parked.key, turn_id=parked.id)
        assert (d.status, d.decided_by) == ("cancelled", None)
    assert launched == []


@pytest.mark.parametrize(
    ("policy", "status"), [("interrupt", "interrupted"), ("rollback", "rolled_back")]
)
async def test_an_interrupt_sent_as_a_decision_is_made_always_ends_that_turn(
    store: Store, policy: Policy, status: str
) -> None:
    # Before, on PostgreSQL, 2-8 in 20 such turns ran to the end: the interrupt found the turn
    # decided and not yet resumed, its ending lost the race to the resume, and nobody asked
    # the resumed turn to stop.
    def slowly(request: ModelRequest) -> Response:
        if request.messages[-1].role == "tool":
            return Slow("and so on " * 20, delay=0.02)
        return ToolCalls(Call("launch", {"target": last_user_text(request)}))

    agent = Agent(name="launcher", model=ScriptedModel(default=slowly), tools=[launch])
    plain = Agent(name="plain", model=ScriptedModel(default="fine"))
    async with Runtime(store, agents=[agent, plain]) as rt:
        for n in range(12):
            sid = f"race-{n}"
            parked = await _parked(rt, agent, sid=sid)
            d = await _pending(rt, parked)
            newer = rt.submit(plain, "never mind", session_id=sid, policy=policy)

            async def approve(parked: Turn = parked, d: Decision = d) -> None:
                try:
                    await rt.decide(parked.key, parked.id, d.call_id, "approve")
                except DecisionMade as exc:
                    # The race's other way: the interrupt ended the turn first, which
                    # cancelled its decision. The turn must end as interrupted all the same.
                    assert exc.decision.status == "cancelled", exc.decision

            _, submitted = await asyncio.gather(approve(), newer)
            async with asyncio.timeout(20):
                old = await rt.scheduler.wait(parked.key, parked.id)
                done = await rt.scheduler.wait(submitted.key, submitted.id)
            assert (old.status, old.reason) == (status, policy), n
            assert done.output == "fine"
            assert_paired(await all_items(rt, parked.key))


async def test_cancelling_a_parked_turn_pairs_its_call(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        done = await rt.scheduler.cancel(parked.key, parked.id)
        assert (done.status, done.reason) == ("cancelled", "cancelled")
        assert_paired(await all_items(rt, parked.key))
        d = (await rt.decisions(parked.key, turn_id=parked.id))[0]
        with pytest.raises(DecisionMade):
            await rt.decide(parked.key, parked.id, d.call_id, "approve")
    assert launched == []


async def test_a_deadline_refuses_and_late_decisions_are_conflicts(store: Store) -> None:
    agent = _agent(approval_timeout=0.2)
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
        started = time.monotonic()
        done = await rt.scheduler.wait(parked.key, parked.id)
        assert time.monotonic() - started < 5  # the sweep sleeps towards the deadline
        assert done.output == f"tool said: {EXPIRED_RESULT}"
        [expired] = await rt.decisions(parked.key, turn_id=parked.id)
        assert (expired.status, expired.decided_by) == ("expired", None)
        with pytest.raises(DecisionMade) as late:
            await rt.decide(parked.key, parked.id, d.call_id, "approve")
        assert late.value.decision.status == "expired"
    assert launched == []


async def test_a_second_decision_and_a_stranger_change_nothing(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
        stranger = SessionKey(parked.key.tenant, "mallory", parked.key.session_id)
        with pytest.raises(DecisionNotFound):
            await rt.decide(stranger, parked.id, d.call_id, "approve")
        with pytest.raises(DecisionNotFound):
            await rt.decide(parked.key, parked.id, "no-such-call", "approve")
        first = await rt.decide(parked.key, parked.id, d.call_id, "deny")
        with pytest.raises(DecisionMade) as again:
            await rt.decide(parked.key, parked.id, d.call_id, "approve")
        assert again.value.decision == first
        done = await rt.scheduler.wait(parked.key, parked.id)
        assert done.output == f"tool said: {REFUSED_RESULT}"
    assert launched == []


async def test_always_approves_the_tool_for_this_session_only(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent, "first")
        d = await _pending(rt, parked)
        await rt.decide(parked.key, parked.id, d.call_id, "always")
        assert (await rt.scheduler.wait(parked.key, parked.id)).status == "completed"
        record = await rt.get_session(parked.key)
        assert record is not None and record.state[ALWAYS_KEY] == ["launch"]
        # Same session: runs without asking.
        assert await rt.chat(agent, "second", session_id="s") == "tool said: launched second"
        assert await rt.decisions(parked.key, status="pending") == []
        # Another session asks again.
        other = await _parked(rt, agent, "third", sid="s2")
        await _pending(rt, other)
        # Revoked (state written without it): the session asks again.
        await rt.sessions.update(parked.key, state={})
        again = await _parked(rt, agent, "fourth")
        await _pending(rt, again)
    assert launched == ["first", "second"]


@pytest.mark.parametrize("ending", ["deny", "expire"])
async def test_a_calls_own_refusal_stands_when_always_comes_while_it_waits(
    store: Store, ending: str
) -> None:
    # Before, "always" for the tool, given while the call waited (a state edit, another
    # call's answer), ran the very call a human had denied or let expire.
    agent = _agent(approval_timeout=0.5) if ending == "expire" else _agent()
    async with Runtime(store, agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
        await rt.sessions.update(parked.key, state={ALWAYS_KEY: ["launch"]})
        if ending == "deny":
            await rt.decide(parked.key, parked.id, d.call_id, "deny")
        done = await rt.scheduler.wait(parked.key, parked.id)
        refused = REFUSED_RESULT if ending == "deny" else EXPIRED_RESULT
        assert done.output == f"tool said: {refused}"
        [record] = await rt.decisions(parked.key, turn_id=parked.id)
        assert record.status == ("denied" if ending == "deny" else "expired")
        # The next call of the tool is approved by "always", as the session said.
        assert await rt.chat(agent, "next", session_id="s") == "tool said: launched next"
    assert launched == ["next"]


async def test_on_decision_callbacks_decide_in_process(store: Store) -> None:
    agent = _agent()
    seen: list[Decision] = []

    def approve(d: Decision) -> bool:
        seen.append(d)
        return True

    async def refuse(d: Decision) -> str:
        return "deny"

    def broken(d: Decision) -> bool:
        raise RuntimeError("the approval UI crashed")

    async with Runtime(store, agents=[agent]) as rt:
        assert await rt.chat(agent, "a", session_id="s", on_decision=approve) == (
            "tool said: launched a"
        )
        assert [d.payload["tool"] for d in seen] == ["launch"]
        assert await rt.chat(agent, "b", session_id="s", on_decision=refuse) == (
            f"tool said: {REFUSED_RESULT}"
        )
        assert await rt.chat(agent, "c", session_id="s", on_decision=broken) == (
            f"tool said: {REFUSED_RESULT}"  # fails closed
        )
        for nonsense in (1, 0, {"approve": True}):
            # Not an answer: refused too (before, 1 raised AttributeError from chat and left
            # the decision pending).

            def answers(d: Decision, said: object = nonsense) -> DecisionAnswer:
                return said  # type: ignore[return-value]

            reply = await rt.chat(agent, "x", session_id="s", on_decision=answers)
            assert reply == f"tool said: {REFUSED_RESULT}"
        here = rt.key_for(agent, "s", LOCAL_PRINCIPAL)
        assert await rt.decisions(here, status="pending") == []
        with pytest.raises(DecisionRequired) as required:
            await rt.chat(agent, "d", session_id="s")
        d = required.value.decision
        assert d.payload["tool"] == "launch" and required.value.turn is not None
        await rt.decide(d.key, d.turn_id, d.call_id, "approve")
        done = await rt.settle(required.value.turn)
        assert done.output == "tool said: launched d"
    assert launched == ["a", "d"]


async def test_runtime_default_on_decision(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent], on_decision=lambda d: "approve") as rt:
        assert await rt.chat(agent, "x", session_id="s") == "tool said: launched x"
    assert launched == ["x"]


def _asker(request: ModelRequest) -> str | ToolCalls:
    last = request.messages[-1]
    if last.role == "tool":
        return f"noted: {last.content}"
    return ToolCalls(Call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}))


async def test_ask_user_round_trip(store: Store) -> None:
    agent = Agent(name="asker", model=ScriptedModel(default=_asker), ask_user=True)
    asked: list[Decision] = []

    def answer(d: Decision) -> str:
        asked.append(d)
        return "blue"

    async with Runtime(store, agents=[agent]) as rt:
        reply = await rt.chat(agent, "paint it", session_id="s", on_decision=answer)
        assert reply == "noted: The user answered: blue"
        [d] = asked
        assert (d.kind, d.payload["question"], d.payload["choices"]) == (
            "question",
            "Which colour?",
            ["red", "blue"],
        )
        # An answer outside the choices refuses rather than leaving the turn waiting.
        reply = await rt.chat(agent, "again", session_id="s", on_decision=lambda d: "green")
        assert reply.startswith("noted: The user did not answer")
        [_, second] = await rt.decisions(key("s"))
        assert second.status == "denied"


def _looper(request: ModelRequest) -> ToolCalls:
    n = sum(1 for m in request.messages if m.role == "tool")
    return ToolCalls(Call("step", {"n": n}))


@tool
def step(n: int) -> str:
    """One more step of a long task."""
    return f"step {n} done"


@pytest.mark.parametrize(
    ("verdicts", "status", "reason", "steps"),
    [
        ([], "limit_reached", "max_iterations", 2),  # stop (the default)
        (["deny"], "limit_reached", "max_iterations", 2),
        (["approve", "deny"], "limit_reached", "max_iterations", 4),
        (["approve", "approve", "approve"], "limit_reached", "max_total_iterations", 6),
    ],
    ids=["stop", "ask-deny", "ask-approve-then-deny", "ask-to-the-cap"],
)
async def test_on_max_iterations(
    store: Store, verdicts: list[str], status: str, reason: str, steps: int
) -> None:
    policy = "ask" if verdicts else "stop"
    agent = Agent(
        name="long",
        model=ScriptedModel(default=_looper),
        tools=[step],
        max_iterations=2,
        max_total_iterations=6,
        on_max_iterations=policy,  # type: ignore[arg-type]
    )
    said = iter(verdicts)
    questions: list[Decision] = []

    def decide(d: Decision) -> str:
        questions.append(d)
        return next(said)

    async with Runtime(store, agents=[agent]) as rt:
        turn = await rt.submit(agent, "work", session_id="s")
        done = await rt.settle(turn, decide)
        assert (done.status, done.reason) == (status, reason)
        assert done.usage.model_calls == steps
        assert_paired(await all_items(rt, turn.key))
    asked = len(questions)
    assert asked == (len(verdicts) if reason == "max_iterations" else 2)
    for q in questions:
        assert (
            q.kind == "approval" and q.payload["steps"] == 2 and "Continue" in q.payload["question"]
        )


async def test_finish_answers_at_the_limit(store: Store) -> None:
    def model(request: ModelRequest) -> str | ToolCalls:
        if not request.tools:
            return "here is what I found"
        return ToolCalls(Call("step", {"n": 1}))

    agent = Agent(
        name="f",
        model=ScriptedModel(default=model),
        tools=[step],
        max_iterations=1,
        on_max_iterations="finish",
    )
    async with Runtime(store, agents=[agent]) as rt:
        turn = await rt.submit(agent, "work", session_id="s")
        done = await rt.scheduler.wait(turn.key, turn.id)
        assert (done.status, done.reason, done.output) == (
            "completed",
            "finished_at_limit",
            "here is what I found",
        )


async def test_a_decision_survives_a_restart(make_store: StoreFactory) -> None:
    """Stop the runtime while a turn waits, start another on the same store, decide: it goes
    on (the in-memory store dies with its process, so SQLite and PostgreSQL only)."""
    if isinstance(make_store(), InMemoryStore):
        pytest.skip("the in-memory store does not outlive its runtime")
    agent = _agent()
    async with Runtime(make_store(), agents=[agent]) as rt:
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
    async with Runtime(make_store(), agents=[_agent()]) as rt:
        await rt.decide(parked.key, parked.id, d.call_id, "approve")
        done = await rt.scheduler.wait(parked.key, parked.id)
        assert done.output == "tool said: launched rocket"
    assert launched == ["rocket"]


async def test_chat_without_a_decider_raises_and_keeps_the_turn(store: Store) -> None:
    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        with pytest.raises(DecisionRequired):
            await rt.chat(agent, "rocket", session_id="s")
        [d] = await rt.decisions(key("s"), status="pending")
        await rt.decide(d.key, d.turn_id, d.call_id, "deny")
        turn = await rt.store.get_turn(d.key, d.turn_id)
        assert turn is not None
        done = await rt.settle(turn)
        assert done.output == f"tool said: {REFUSED_RESULT}"


async def test_a_preemption_that_arrives_as_the_turn_parks_ends_it(store: Store) -> None:
    """Interrupt asked through the store (from another process) while the turn ran, read by
    nobody before it parked: the runner ends it parked, so the newer turn does not wait for a
    decision nobody may make."""
    from tether.records import NewDecision, NewItem, Usage
    from tether.store.rules import new_decision

    agent = _agent()
    async with Runtime(store, agents=[agent]) as rt:
        k = key("late")
        await rt.sessions.create(k, agent.name)
        await rt.store.enqueue_turn(k, turn_id="t_late", input="x", policy="enqueue")
        lease = await rt.store.acquire_lease(k, "elsewhere", 30)
        assert lease is not None
        await rt.store.start_turn(lease, "t_late", [NewItem("user", "x")], [])
        assert await rt.store.request_cancel(k, "t_late", "interrupted", "interrupt")
        asked = new_decision(k, "t_late", NewDecision("c1", "approval", {"tool": "launch"}), 0)
        parked = await rt.store.park_turn(
            lease,
            "t_late",
            [NewItem("tool_call", call_id="c1", tool_name="launch")],
            [],
            asked,
            usage=Usage(),
        )
        done = await rt.scheduler.runner._honour_late_cancel(parked)
        assert (done.status, done.reason) == ("interrupted", "interrupt")
        assert_paired(await all_items(rt, k))


async def test_a_turn_queued_behind_a_waiting_one_is_told_so(store: Store) -> None:
    """A chat behind a turn that waits for a human does not hang until the deadline: it gets
    the decision it waits behind (DecisionRequired, or its on_decision decides it)."""
    agent = _agent()
    plain = Agent(name="plain", model=ScriptedModel(default="after"))
    async with Runtime(store, agents=[agent, plain]) as rt:
        parked = await _parked(rt, agent)
        d = await _pending(rt, parked)
        async with asyncio.timeout(10):
            with pytest.raises(DecisionRequired) as behind:
                await rt.chat(plain, "next", session_id="s")
        assert behind.value.decision == d  # the earlier turn's decision
        assert behind.value.turn is not None and behind.value.turn.status == "queued"
        # With a decider, it decides the one ahead and gets its own reply.
        async with asyncio.timeout(10):
            reply = await rt.chat(plain, "and then", session_id="s", on_decision=lambda d: True)
        assert reply == "after"
    assert launched == ["rocket"]
