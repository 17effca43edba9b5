"""Decisions a parked turn waits for (DESIGN §3 ``awaiting_input``, §7).

A running turn parks on a decision in one fenced write (its calls, the decision row, its usage
and held memory); it then holds the session's place in order but no lease. Any process may
decide it, once: the decision ends, ``decision.made`` is written on the turn and the turn is
queued again for the session's next owner, who resumes it under a fresh lease. A deadline
passing ends the decision ``expired``; a parked turn can be ended without a lease (cancel,
interrupt, rollback) with every call paired. Decisions are scoped by session key like
everything else: another owner's decision does not exist.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tether.errors import (
    Conflict,
    DecisionMade,
    DecisionNotFound,
    InvalidInput,
    SessionBusy,
    StaleLease,
)
from tether.events import DECISION_MADE, DECISION_REQUESTED, TURN_ENDED
from tether.records import (
    ABORTED_TOOL_RESULT,
    Decision,
    Lease,
    MemoryWrites,
    Namespace,
    NewDecision,
    NewItem,
    PrincipalLimits,
    SessionKey,
    TurnEnding,
    Usage,
)
from tether.store import rules
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    acquire,
    call,
    ev,
    key,
    new_session,
    note,
    result,
    running_turn,
    snapshot,
    vec,
)

USAGE = Usage(12, 5, 1)


def asked(
    call_id: str = "c2", *, kind: str = "approval", timeout: float = 600.0, **payload: object
) -> NewDecision:
    if not payload:
        payload = {"tool": "lookup", "arguments": '{"q": 1}'}
    return NewDecision(call_id, "approval" if kind == "approval" else "question", payload, timeout)


async def parked(
    store: Store,
    k: SessionKey,
    turn_id: str = "t1",
    *,
    decision: NewDecision | None = None,
    memory: MemoryWrites | None = None,
) -> tuple[Lease, Decision]:
    """A turn that ran one call (c1, answered) and parked on the next (c2), lease released."""
    lease = await running_turn(store, k, turn_id)
    d = rules.new_decision(k, turn_id, decision or asked(), time.time())
    await store.park_turn(
        lease,
        turn_id,
        [call("c1"), call("c2"), result("c1")],
        [ev(3, DECISION_REQUESTED, call_id=d.call_id)],
        d,
        usage=USAGE,
        memory=memory,
    )
    await store.release_lease(lease)
    return lease, d


def held(k: SessionKey, record_id: str = "n1") -> MemoryWrites:
    record = note(
        Namespace.session(k), record_id, "likes tea", meta={"author": "auto", "turn_id": "t1"}
    )
    return MemoryWrites(((record, vec(1.0, 0.0)),), ())


class DecisionsConformance:
    """Park, decide once, expire, resume, end while parked.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_a_parked_turn_holds_its_place_and_its_decision(self, store: Store) -> None:
        k = await new_session(store)
        lease, d = await parked(store, k)
        turn = await store.get_turn(k, "t1")
        assert turn is not None and turn.status == "awaiting_input" and not turn.ended
        assert turn.usage == USAGE
        [stored] = await store.list_decisions(k)
        assert stored == d and stored.pending and stored.key == k
        assert stored.deadline == pytest.approx(stored.created_at + 600.0, abs=0.01)
        assert [i.kind for i in await store.list_items(k)] == [
            "user",
            "tool_call",
            "tool_call",
            "tool_result",
        ]
        assert [e.type for e in await store.list_events(k, "t1")][-1] == DECISION_REQUESTED
        # Parked, the turn takes no more writes under its old lease (nor a new one).
        fresh = await acquire(store, k, "node-b")
        with pytest.raises(Conflict):
            await store.append(fresh, "t1", [result("c2")], [])
        with pytest.raises(StaleLease):
            await store.append(lease, "t1", [result("c2")], [])
        await store.release_lease(fresh)
        # It counts as the session's busy turn; new turns queue behind it.
        assert [t.id for t in await store.active_turns(k)] == ["t1"]
        with pytest.raises(SessionBusy) as busy:
            await store.enqueue_turn(k, turn_id="t2", input="next", policy="reject")
        assert busy.value.busy_turn_id == "t1"
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        assert [t.status for t in await store.active_turns(k)] == ["awaiting_input", "queued"]
        with pytest.raises(SessionBusy):
            await store.clear_items(k)

    async def test_park_is_fenced_and_all_or_nothing(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.release_lease(lease)
        await acquire(store, k, "node-b")  # lease moved on: the old owner is stale
        before = await snapshot(store, k)
        d = rules.new_decision(k, "t1", asked(), time.time())
        with pytest.raises(StaleLease):
            await store.park_turn(
                lease, "t1", [call("c2")], [ev(3, DECISION_REQUESTED)], d, usage=USAGE
            )
        assert await snapshot(store, k) == before
        assert await store.list_decisions(k) == []

    async def test_a_parked_session_has_no_work_until_decided(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        assert k not in await store.sessions_needing_work()
        assert k not in await store.sessions_needing_work(unowned_at=time.time())
        await store.decide(k, "t1", "c2", "approve", by="alice")
        assert k in await store.sessions_needing_work(unowned_at=time.time())

    async def test_a_decision_is_made_once(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        done = await store.decide(k, "t1", "c2", "approve", by="alice")
        assert (done.status, done.decided_by, done.answer) == ("approved", "alice", None)
        assert done.decided_at is not None
        turn = await store.get_turn(k, "t1")
        assert turn is not None and turn.status == "queued" and turn.started_at is not None
        events = await store.list_events(k, "t1")
        assert events[-1].type == DECISION_MADE and events[-1].seq == 4
        assert events[-1].data["status"] == "approved"
        with pytest.raises(DecisionMade) as again:
            await store.decide(k, "t1", "c2", "deny", by="bob")
        assert again.value.decision == done
        assert await store.list_decisions(k, status="pending") == []
        assert await store.list_decisions(k, status="approved") == [done]

    async def test_concurrent_deciders_one_wins(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)

        async def decide(n: int) -> str:
            try:
                await store.decide(k, "t1", "c2", "approve" if n % 2 else "deny", by=f"u{n}")
            except DecisionMade:
                return "late"
            return "won"

        outcomes = await asyncio.gather(*(decide(n) for n in range(10)))
        assert outcomes.count("won") == 1
        made = [e for e in await store.list_events(k, "t1") if e.type == DECISION_MADE]
        assert len(made) == 1

    async def test_unknown_and_foreign_decisions_do_not_exist(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        bob = await new_session(store, key("s1", owner="bob"))
        for where, turn_id, call_id in [
            (k, "t1", "nope"),
            (k, "nope", "c2"),
            (bob, "t1", "c2"),
            (key("s1", owner="alice", tenant="globex"), "t1", "c2"),
        ]:
            with pytest.raises(DecisionNotFound):
                await store.decide(where, turn_id, call_id, "approve", by="mallory")
        assert await store.list_decisions(bob) == []
        [d] = await store.list_decisions(k)
        assert d.pending

    async def test_a_verdict_the_kind_does_not_take_changes_nothing(self, store: Store) -> None:
        k = await new_session(store)
        q = asked("q1", kind="question", question="Which colour?", choices=["red", "blue"])
        await parked(store, k, decision=q)
        before = await snapshot(store, k)
        for verdict, answer in [("approve", None), ("always", None), ("answer", "green")]:
            with pytest.raises(InvalidInput):
                await store.decide(k, "t1", "q1", verdict, answer=answer, by="alice")  # type: ignore[arg-type]
        assert await snapshot(store, k) == before
        done = await store.decide(k, "t1", "q1", "answer", answer="blue", by="alice")
        assert (done.status, done.answer) == ("answered", "blue")

    async def test_always_approves_the_tool_in_session_state(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        revision = (await store.get_session(k)).revision  # type: ignore[union-attr]
        await store.decide(k, "t1", "c2", "always", by="alice")
        record = await store.get_session(k)
        assert record is not None
        assert rules.always_approved(record.state) == {"lookup"}
        assert record.revision > revision
        # Revocable: the state written without it.
        await store.update_session(k, state={})
        record = await store.get_session(k)
        assert record is not None and rules.always_approved(record.state) == frozenset()

    async def test_the_next_owner_resumes_a_decided_turn(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k, memory=held(k))
        lease = await acquire(store, k, "node-b")
        with pytest.raises(Conflict):  # not decided yet: nothing to resume
            await store.resume_turn(lease, "t1", [ev(4)])
        await store.decide(k, "t1", "c2", "approve", by="alice")
        items, memory = await store.resume_turn(lease, "t1", [ev(5)])
        assert [(i.kind, i.call_id) for i in items] == [
            ("user", None),
            ("tool_call", "c1"),
            ("tool_call", "c2"),
            ("tool_result", "c1"),
        ]
        assert memory is not None and [r.id for r, _ in memory.put] == ["n1"]
        assert memory.put[0][1] == vec(1.0, 0.0)
        turn = await store.get_turn(k, "t1")
        assert turn is not None and turn.status == "running"
        # The resumed turn goes on writing under the new lease and ends as any turn does.
        await store.append(lease, "t1", [result("c2")], [ev(6)])
        done = await store.end_turn(
            lease,
            "t1",
            TurnEnding("completed", "answered", "done", True),
            [],
            [ev(7, TURN_ENDED)],
            memory=memory,
        )
        assert done.status == "completed"
        assert [r.id for r in await store.list_memory([Namespace.session(k)])] == ["n1"]

    async def test_a_resumed_turn_whose_owner_dies_keeps_its_usage(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        await store.decide(k, "t1", "c2", "approve", by="alice")
        doomed = await acquire(store, k, "node-b", ttl=0.05)
        await store.resume_turn(doomed, "t1", [ev(5)])
        await asyncio.sleep(0.15)  # node-b dies mid-tool; its lease runs out
        [lost] = await store.recover(await acquire(store, k, "node-c"))
        assert (lost.status, lost.reason) == ("failed", "owner_lost")
        assert lost.usage == USAGE
        assert rules.unanswered_calls(await store.list_items(k)) == []

    async def test_a_turn_that_never_started_does_not_resume(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="hi", policy="enqueue")
        lease = await acquire(store, k)
        with pytest.raises(Conflict):
            await store.resume_turn(lease, "t1", [ev(2)])

    async def test_a_decided_turn_does_not_start_again(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        await store.decide(k, "t1", "c2", "approve", by="alice")
        lease = await acquire(store, k, "node-b")
        before = await snapshot(store, k)
        with pytest.raises(Conflict):  # it goes on (resume_turn); a start would repeat its input
            await store.start_turn(lease, "t1", [NewItem("user", "hello")], [ev(5)])
        assert await snapshot(store, k) == before

    async def test_deadlines_expire_decisions(self, store: Store) -> None:
        k = await new_session(store)
        assert await store.next_decision_deadline() is None
        _, d = await parked(store, k, decision=asked(timeout=0.05))
        assert await store.next_decision_deadline() == pytest.approx(d.deadline, abs=0.01)
        assert await store.expire_decisions(time.time() - 1) == []
        await asyncio.sleep(0.1)
        assert await store.expire_decisions(time.time()) == [k]
        assert await store.expire_decisions(time.time()) == []  # each ends once
        [done] = await store.list_decisions(k)
        assert (done.status, done.decided_by) == ("expired", None)
        turn = await store.get_turn(k, "t1")
        assert turn is not None and turn.status == "queued"
        assert (await store.list_events(k, "t1"))[-1].data["status"] == "expired"
        assert await store.next_decision_deadline() is None
        with pytest.raises(DecisionMade):
            await store.decide(k, "t1", "c2", "approve", by="alice")

    async def test_cancelling_a_parked_turn_pairs_its_calls(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k, memory=held(k))
        done = await store.end_waiting_turn(k, "t1", "cancelled")
        assert done is not None and (done.status, done.reason) == ("cancelled", "cancelled")
        assert done.usage == USAGE  # what it spent before it parked is still its usage
        items = await store.list_items(k)
        assert (items[-1].kind, items[-1].call_id, items[-1].content) == (
            "tool_result",
            "c2",
            ABORTED_TOOL_RESULT,
        )
        assert rules.unanswered_calls(items) == []
        [d] = await store.list_decisions(k)
        assert (d.status, d.decided_by) == ("cancelled", None)
        events = await store.list_events(k, "t1")
        assert [e.type for e in events][-2:] == [DECISION_MADE, TURN_ENDED]
        assert [e.seq for e in events] == sorted({e.seq for e in events})
        # A cancelled turn keeps its items, and so the memory it held.
        assert [r.id for r in await store.list_memory([Namespace.session(k)])] == ["n1"]
        assert await store.end_waiting_turn(k, "t1", "cancelled") is None
        assert await store.active_turns(k) == []

    async def test_rolling_back_a_parked_turn_removes_it(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k, memory=held(k))
        done = await store.end_waiting_turn(k, "t1", "rollback", status="rolled_back")
        assert done is not None and done.status == "rolled_back"
        assert await store.list_items(k) == []
        assert await store.list_memory([Namespace.session(k)]) == []

    async def test_a_decided_turn_waiting_to_resume_can_be_cancelled(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        await store.decide(k, "t1", "c2", "approve", by="alice")
        done = await store.end_waiting_turn(k, "t1", "cancelled")
        assert done is not None and done.status == "cancelled"
        assert rules.unanswered_calls(await store.list_items(k)) == []
        [d] = await store.list_decisions(k)
        assert d.status == "approved"  # decided before the cancel: it stays as decided

    async def test_decisions_go_with_their_session(self, store: Store) -> None:
        k = await new_session(store)
        await parked(store, k)
        await store.end_waiting_turn(k, "t1", "cancelled")
        await store.clear_items(k)
        assert await store.list_decisions(k) == []
        await parked(store, k, "t2")
        assert await store.delete_session(k)
        await new_session(store, k)
        assert await store.list_decisions(k) == []
        assert await store.next_decision_deadline() is None

    async def test_a_parked_turn_holds_no_running_slot(self, store: Store) -> None:
        limits = PrincipalLimits(running_turns=1)
        a = await new_session(store, key("a"))
        await parked(store, a)
        b = await new_session(store, key("b"))
        # Alice's one running slot is free: her parked turn holds no worker.
        await store.enqueue_turn(b, turn_id="b1", input="hi", policy="enqueue", limits=limits)
