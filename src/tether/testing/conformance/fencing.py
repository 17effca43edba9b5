"""Fenced writes: a write made under a lost lease, or a clashing one, changes nothing.

The store checks the lease token in the same transaction as the write, so a process that lost
its lease (paused, partitioned, presumed dead) can never add to a history someone else now
owns; the new owner then recovers the dead owner's turn exactly once.
"""

from __future__ import annotations

import asyncio

import pytest

from tether.errors import Conflict, StaleLease
from tether.events import TURN_ENDED
from tether.records import ABORTED_TOOL_RESULT, NewItem, TurnEnding
from tether.store.protocol import Store
from tether.store.rules import LIVE_AHEAD
from tether.testing.conformance._support import (
    LONG_TTL,
    PAST_SHORT_TTL,
    SHORT_TTL,
    acquire,
    call,
    ended_events,
    ev,
    new_session,
    result,
    running_turn,
    snapshot,
)


class FencingConformance:
    """Stale-lease and clashing writes change nothing; a dead owner's turn is recovered.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_expired_lease_fences_every_write_of_the_old_owner(self, store: Store) -> None:
        k = await new_session(store)
        old = await running_turn(store, k, "t1", ttl=SHORT_TTL)
        await store.append(old, "t1", [call("c1")], [ev(3)])
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        await asyncio.sleep(PAST_SHORT_TTL)
        assert await store.lease_holder(k) is None

        new = await acquire(store, k, "node-b")
        assert new.token > old.token
        assert await store.lease_holder(k) == "node-b"
        before = await snapshot(store, k)

        with pytest.raises(StaleLease):
            await store.start_turn(old, "t2", [NewItem("user", "next")], [ev(2)])
        with pytest.raises(StaleLease):
            await store.append(old, "t1", [result("c1")], [ev(4)])
        with pytest.raises(StaleLease):
            await store.end_turn(
                old,
                "t1",
                TurnEnding("completed", "answered", output="late", complete=True),
                [NewItem("assistant", "late")],
                [ev(4, TURN_ENDED)],
            )
        with pytest.raises(StaleLease):
            await store.recover(old)
        assert await store.renew_leases([old], LONG_TTL) == []
        await store.release_lease(old)
        assert await snapshot(store, k) == before
        assert await store.lease_holder(k) == "node-b"
        assert await store.acquire_lease(k, "node-c", LONG_TTL) is None

        # The new owner's writes go through.
        recovered = await store.recover(new)
        assert [t.id for t in recovered] == ["t1"]
        await store.start_turn(new, "t2", [NewItem("user", "next")], [ev(2)])
        t2 = await store.get_turn(k, "t2")
        assert t2 is not None and t2.status == "running"

    async def test_duplicate_event_seq_is_conflict_and_writes_nothing(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [NewItem("assistant", "a")], [ev(3)])
        await store.enqueue_turn(k, turn_id="t2", input="x", policy="enqueue")
        before = await snapshot(store, k)

        with pytest.raises(Conflict):
            await store.append(lease, "t1", [NewItem("assistant", "dup")], [ev(4), ev(3)])
        with pytest.raises(Conflict):
            await store.append(lease, "t1", [NewItem("assistant", "dup")], [ev(5), ev(5)])
        with pytest.raises(Conflict):
            await store.end_turn(
                lease,
                "t1",
                TurnEnding("completed", "answered"),
                [NewItem("assistant", "dup")],
                [ev(2)],
            )
        with pytest.raises(Conflict):  # seq 1 is the queued event
            await store.start_turn(lease, "t2", [NewItem("user", "x")], [ev(1)])
        assert await snapshot(store, k) == before

        # The item seqs the failed writes would have used are still the next ones.
        written = await store.append(lease, "t1", [NewItem("assistant", "b")], [ev(4)])
        assert written[0].seq == 3

    async def test_recover_a_turn_whose_owner_was_lost(self, store: Store) -> None:
        k = await new_session(store)
        old = await running_turn(store, k, "t1", ttl=SHORT_TTL)
        await store.append(
            old,
            "t1",
            [call("c1", "search"), result("c1", "found", "search"), call("c2", "fetch")],
            [ev(3), ev(4)],
        )
        await store.append(old, "t1", [call("c3", "write")], [ev(5)])
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        await asyncio.sleep(PAST_SHORT_TTL)

        new = await acquire(store, k, "node-b")
        recovered = await store.recover(new)
        assert [t.id for t in recovered] == ["t1"]
        t1 = recovered[0]
        assert (t1.status, t1.reason) == ("failed", "owner_lost")
        assert t1.error and t1.ended_at is not None
        assert await store.get_turn(k, "t1") == t1

        items = await store.list_items(k)
        results = [i for i in items if i.kind == "tool_result"]
        by_call = {c: [r for r in results if r.call_id == c] for c in ("c1", "c2", "c3")}
        assert [r.content for r in by_call["c1"]] == ["found"]  # answered: no extra result
        for call_id, tool in (("c2", "fetch"), ("c3", "write")):
            (aborted,) = by_call[call_id]
            assert aborted.content == ABORTED_TOOL_RESULT
            assert (aborted.turn_id, aborted.tool_name) == ("t1", tool)
        assert len(results) == 3
        assert [i.seq for i in items] == list(range(1, len(items) + 1))
        assert all(i.excluded for i in items)  # a failed turn never reaches a model again

        events = await store.list_events(k, "t1")
        (ended,) = ended_events(events)
        assert events[-1] == ended
        # The ending skips the seqs its dead owner may have shown followers without storing.
        assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6 + LIVE_AHEAD]
        assert (ended.data["status"], ended.data["reason"]) == ("failed", "owner_lost")

        t2 = await store.get_turn(k, "t2")
        assert t2 is not None and t2.status == "queued"  # only running turns are recovered
        before = await snapshot(store, k)
        assert await store.recover(new) == []
        assert await snapshot(store, k) == before

    async def test_recover_with_nothing_running(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [call("c9")], [ev(3)]
        )
        await store.enqueue_turn(k, turn_id="t2", input="x", policy="enqueue")
        before = await snapshot(store, k)
        assert await store.recover(lease) == []
        assert await snapshot(store, k) == before

    async def test_set_state_is_fenced_and_keeps_the_other_keys(self, store: Store) -> None:
        """What a running turn keeps in the session's state (its active skills) is written under
        its lease: the owner's write replaces one key only, a lost lease's writes nothing."""
        k = await new_session(store)
        await store.update_session(k, state={"always_approve": ["lookup"], "mine": 1})
        old = await running_turn(store, k, "t1", ttl=SHORT_TTL)
        await store.set_state(old, "active_skills", ["pdf"])
        got = await store.get_session(k)
        assert got is not None
        assert got.state == {"always_approve": ["lookup"], "mine": 1, "active_skills": ["pdf"]}

        await asyncio.sleep(PAST_SHORT_TTL)
        new = await acquire(store, k, "node-b")
        with pytest.raises(StaleLease):
            await store.set_state(old, "active_skills", ["pdf", "sql"])
        after = await store.get_session(k)
        assert after is not None and after.state == got.state

        await store.set_state(new, "active_skills", None)
        cleared = await store.get_session(k)
        assert cleared is not None
        assert cleared.state == {"always_approve": ["lookup"], "mine": 1}
        assert cleared.revision > got.revision
