"""Turns from admission to running: enqueue, the busy policies, the queue bound, start, append.

Admission decides, atomically with the write, whether a turn may join the session's queue; a
rejected or refused turn leaves nothing behind, not even a consumed seq. Once started under a
lease, a turn's items and events are appended only while it runs.
"""

from __future__ import annotations

import time

import pytest

from tether.errors import Conflict, QueueFull, SessionBusy, TurnNotNext
from tether.events import MESSAGE_COMPLETED, TOOL_CALL, TURN_ENDED, TURN_QUEUED, TURN_STARTED
from tether.records import NewItem, TurnEnding, Usage
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    CLOCK_SLACK,
    acquire,
    call,
    ended_events,
    ev,
    key,
    new_session,
    running_turn,
    snapshot,
)


class TurnsConformance:
    """Admitting, queueing, cancelling, starting and appending to turns.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_enqueue_assigns_seq_and_writes_queued_event(self, store: Store) -> None:
        k = await new_session(store)
        turns = [
            await store.enqueue_turn(k, turn_id=f"t{n}", input=f"q{n}", policy="enqueue")
            for n in (1, 2, 3)
        ]
        assert [t.seq for t in turns] == [1, 2, 3]
        for n, t in enumerate(turns, start=1):
            assert (t.id, t.key, t.input, t.policy, t.status) == (
                f"t{n}",
                k,
                f"q{n}",
                "enqueue",
                "queued",
            )
            assert (t.reason, t.error, t.output, t.complete) == (None, None, None, False)
            assert t.started_at is None and t.ended_at is None
            assert t.usage == Usage()
            assert await store.get_turn(k, t.id) == t
            events = await store.list_events(k, t.id)
            assert [(e.turn_id, e.seq, e.type) for e in events] == [(t.id, 1, TURN_QUEUED)]
        assert await store.list_turns(k) == turns
        assert await store.list_turns(k, after_seq=1) == turns[1:]
        assert await store.list_turns(k, after_seq=1, limit=1) == turns[1:2]

    async def test_duplicate_turn_id_is_conflict(self, store: Store) -> None:
        k = await new_session(store)
        first = await store.enqueue_turn(k, turn_id="t1", input="a", policy="enqueue")
        with pytest.raises(Conflict):
            await store.enqueue_turn(k, turn_id="t1", input="b", policy="enqueue")
        assert await store.list_turns(k) == [first]
        assert len(await store.list_events(k, "t1")) == 1
        again = await store.enqueue_turn(k, turn_id="t2", input="c", policy="enqueue")
        assert again.seq == 2

    async def test_reject_policy_when_busy(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="a", policy="enqueue")
        before = await snapshot(store, k)
        with pytest.raises(SessionBusy) as queued_busy:
            await store.enqueue_turn(k, turn_id="t2", input="b", policy="reject")
        assert queued_busy.value.busy_turn_id == "t1"
        assert await snapshot(store, k) == before
        assert await store.get_turn(k, "t2") is None

        lease = await acquire(store, k)
        await store.start_turn(lease, "t1", [NewItem("user", "a")], [ev(2)])
        before = await snapshot(store, k)
        with pytest.raises(SessionBusy) as running_busy:
            await store.enqueue_turn(k, turn_id="t2", input="b", policy="reject")
        assert running_busy.value.busy_turn_id == "t1"
        assert await snapshot(store, k) == before

        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        accepted = await store.enqueue_turn(k, turn_id="t2", input="b", policy="reject")
        assert accepted.seq == 2  # the rejected attempts consumed no seq
        assert accepted.status == "queued"

    async def test_enqueue_is_bounded_by_max_queue(self, store: Store) -> None:
        k = await new_session(store)
        for n in (1, 2, 3):
            await store.enqueue_turn(k, turn_id=f"t{n}", input="x", policy="enqueue", max_queue=3)
        before = await snapshot(store, k)
        with pytest.raises(QueueFull) as full:
            await store.enqueue_turn(k, turn_id="t4", input="x", policy="enqueue", max_queue=3)
        assert isinstance(full.value, SessionBusy)
        assert full.value.busy_turn_id == "t1"
        assert await snapshot(store, k) == before
        assert await store.get_turn(k, "t4") is None
        assert await store.list_events(k, "t4") == []

        # The bound counts queued turns: once one runs there is room again.
        lease = await acquire(store, k)
        await store.start_turn(lease, "t1", [NewItem("user", "x")], [ev(2)])
        t4 = await store.enqueue_turn(k, turn_id="t4", input="x", policy="enqueue", max_queue=3)
        assert t4.seq == 4
        with pytest.raises(QueueFull):
            await store.enqueue_turn(k, turn_id="t5", input="x", policy="enqueue", max_queue=3)

    async def test_active_turns_in_seq_order(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        await running_turn(store, k, "t2", lease=lease)
        for n in (3, 4, 5):
            await store.enqueue_turn(k, turn_id=f"t{n}", input="x", policy="enqueue")
        await store.end_waiting_turn(k, "t4", "cancelled")
        active = await store.active_turns(k)
        assert [(t.id, t.status) for t in active] == [
            ("t2", "running"),
            ("t3", "queued"),
            ("t5", "queued"),
        ]
        assert [t.seq for t in active] == [2, 3, 5]

    async def test_end_waiting_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="a", policy="enqueue")
        await store.enqueue_turn(k, turn_id="t2", input="b", policy="enqueue")
        cancelled = await store.end_waiting_turn(k, "t2", "cancelled")
        assert cancelled is not None
        assert (cancelled.id, cancelled.status, cancelled.reason) == (
            "t2",
            "cancelled",
            "cancelled",
        )
        assert cancelled.ended_at is not None and cancelled.ended
        assert await store.get_turn(k, "t2") == cancelled
        events = await store.list_events(k, "t2")
        assert [(e.seq, e.type) for e in events] == [(1, TURN_QUEUED), (2, TURN_ENDED)]
        assert events[1].data["status"] == "cancelled"
        assert events[1].data["reason"] == "cancelled"

        # Once ended, or once running, it is no longer this call's to cancel.
        assert await store.end_waiting_turn(k, "t2", "caller_cancelled") is None
        assert len(ended_events(await store.list_events(k, "t2"))) == 1
        lease = await acquire(store, k)
        await store.start_turn(lease, "t1", [NewItem("user", "a")], [ev(2)])
        assert await store.end_waiting_turn(k, "t1", "cancelled") is None
        t1 = await store.get_turn(k, "t1")
        assert t1 is not None and t1.status == "running"
        assert ended_events(await store.list_events(k, "t1")) == []
        assert await store.end_waiting_turn(k, "nope", "internal_error") is None
        assert [t.id for t in await store.active_turns(k)] == ["t1"]

    async def test_sessions_needing_work(self, store: Store) -> None:
        idle, queued, running, ended = [
            await new_session(store, key(sid)) for sid in ("idle", "queued", "running", "ended")
        ]
        await store.enqueue_turn(queued, turn_id="q1", input="x", policy="enqueue")
        await running_turn(store, running, "r1")
        lease = await running_turn(store, ended, "e1")
        await store.end_turn(lease, "e1", TurnEnding("completed", "answered"), [], [ev(3)])
        await store.enqueue_turn(ended, turn_id="e2", input="x", policy="enqueue")
        await store.end_waiting_turn(ended, "e2", "internal_error")
        await store.create_session(key("queued", owner="bob"), "assistant")
        needing = await store.sessions_needing_work()
        assert sorted(needing, key=lambda k: k.session_id) == [queued, running]
        assert idle not in needing

    async def test_start_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="hello", policy="enqueue")
        lease = await acquire(store, k)
        before = time.time()
        items = await store.start_turn(
            lease, "t1", [NewItem("user", "hello", meta={"lang": "en"})], [ev(2, TURN_STARTED)]
        )
        assert len(items) == 1
        user = items[0]
        assert (user.seq, user.turn_id, user.kind, user.content) == (1, "t1", "user", "hello")
        assert user.meta == {"lang": "en"} and user.complete and not user.excluded
        assert await store.list_items(k) == items
        turn = await store.get_turn(k, "t1")
        assert turn is not None and turn.status == "running"
        assert turn.started_at is not None and turn.started_at >= before - CLOCK_SLACK
        assert turn.ended_at is None
        events = await store.list_events(k, "t1")
        assert [(e.seq, e.type) for e in events] == [(1, TURN_QUEUED), (2, TURN_STARTED)]

        before_snap = await snapshot(store, k)
        with pytest.raises(Conflict):
            await store.start_turn(lease, "t1", [NewItem("user", "again")], [ev(3)])
        with pytest.raises(Conflict):
            await store.start_turn(lease, "unknown", [NewItem("user", "x")], [ev(2)])
        assert await snapshot(store, k) == before_snap

    async def test_a_turn_starts_only_when_no_earlier_turn_is_active(self, store: Store) -> None:
        """The store keeps a session's order: a worker handed a turn may start it without
        reading the queue, and a start that would jump an earlier active turn is refused."""
        k = await new_session(store)
        for n in (1, 2, 3):
            await store.enqueue_turn(k, turn_id=f"t{n}", input=f"q{n}", policy="enqueue")
        lease = await acquire(store, k)
        before = await snapshot(store, k)
        with pytest.raises(TurnNotNext):  # t1 is queued before it
            await store.start_turn(lease, "t2", [NewItem("user", "q2")], [ev(2, TURN_STARTED)])
        assert await snapshot(store, k) == before
        await store.start_turn(lease, "t1", [NewItem("user", "q1")], [ev(2, TURN_STARTED)])
        with pytest.raises(TurnNotNext):  # t1 runs
            await store.start_turn(lease, "t2", [NewItem("user", "q2")], [ev(2, TURN_STARTED)])
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        await store.end_waiting_turn(k, "t2", "cancelled")
        # An ended turn is refused for its status, not its place; the next active one starts.
        with pytest.raises(Conflict) as refused:
            await store.start_turn(lease, "t2", [NewItem("user", "q2")], [ev(3, TURN_STARTED)])
        assert not isinstance(refused.value, TurnNotNext)
        await store.start_turn(lease, "t3", [NewItem("user", "q3")], [ev(2, TURN_STARTED)])
        assert [t.id for t in await store.active_turns(k)] == ["t3"]

    async def test_append(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        written = await store.append(
            lease,
            "t1",
            [NewItem("assistant", "let me look", complete=False), call("c1")],
            [ev(3, MESSAGE_COMPLETED, delta="let me look"), ev(4, TOOL_CALL, call_id="c1")],
        )
        assert [(i.seq, i.kind) for i in written] == [(2, "assistant"), (3, "tool_call")]
        assert written[0].complete is False
        assert (written[1].call_id, written[1].tool_name, written[1].arguments) == (
            "c1",
            "lookup",
            '{"q": 1}',
        )
        assert (await store.list_items(k))[1:] == written
        events = await store.list_events(k, "t1")
        assert [(e.seq, e.type, e.data) for e in events[2:]] == [
            (3, MESSAGE_COMPLETED, {"delta": "let me look"}),
            (4, TOOL_CALL, {"call_id": "c1"}),
        ]
        # Events alone, or nothing at all, are valid appends.
        assert await store.append(lease, "t1", [], [ev(5)]) == []
        assert await store.append(lease, "t1", [], []) == []
        assert [e.seq for e in await store.list_events(k, "t1")] == [1, 2, 3, 4, 5]

    async def test_append_to_a_turn_not_running_is_conflict(self, store: Store) -> None:
        k = await new_session(store)
        other = await new_session(store, key("s1", owner="bob"))
        lease = await running_turn(store, k, "t1")
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        await store.enqueue_turn(k, turn_id="t2", input="x", policy="enqueue")
        bob_lease = await running_turn(store, other, "bob-turn")
        before, bob_before = await snapshot(store, k), await snapshot(store, other)
        for turn_id in ("t1", "t2", "unknown", "bob-turn"):
            with pytest.raises(Conflict):
                await store.append(lease, turn_id, [NewItem("assistant", "x")], [ev(10)])
        assert await snapshot(store, k) == before
        assert await snapshot(store, other) == bob_before
        await store.append(bob_lease, "bob-turn", [NewItem("assistant", "fine")], [ev(3)])
