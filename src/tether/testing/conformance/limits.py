"""Per-principal bounds, applied by the store in the transaction that admits (DESIGN §11).

A turn on an idle session needs room among the owner's busy sessions; a turn behind a busy one
needs room in the owner's queued turns; a new session needs room among the owner's sessions.
Over a bound is :class:`~tether.errors.LimitExceeded` and nothing is written. Another owner, or
the same user id in another tenant, has room of its own.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tether.errors import LimitExceeded
from tether.records import PrincipalLimits, TurnEnding
from tether.store.protocol import Store
from tether.testing.conformance._support import acquire, ev, key, new_session, running_turn
from tether.testing.conformance.decisions import parked

LIMITS = PrincipalLimits(running_turns=2, queued_turns=1)


async def _enqueue(store: Store, session_id: str, turn_id: str, *, owner: str = "alice") -> None:
    await store.enqueue_turn(
        key(session_id, owner=owner), turn_id=turn_id, input="x", policy="enqueue", limits=LIMITS
    )


class LimitsConformance:
    """Running and queued turns, and sessions, bounded per owner.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_busy_sessions_are_bounded_per_owner(self, store: Store) -> None:
        for sid in ("l1", "l2", "l3"):
            await new_session(store, key(sid))
        await new_session(store, key("l3", owner="bob"))
        await new_session(store, key("l3", tenant="globex"))
        await _enqueue(store, "l1", "a1")
        await _enqueue(store, "l2", "b1")
        with pytest.raises(LimitExceeded) as refused:
            await _enqueue(store, "l3", "c1")
        assert refused.value.retry_after > 0
        assert await store.list_turns(key("l3")) == []
        # Another owner, and the same user id elsewhere, have room of their own.
        await _enqueue(store, "l3", "x1", owner="bob")
        await store.enqueue_turn(
            key("l3", tenant="globex"), turn_id="g1", input="x", policy="enqueue", limits=LIMITS
        )
        # A turn that ends frees its session's room.
        assert await store.end_waiting_turn(key("l1"), "a1", "cancelled") is not None
        await _enqueue(store, "l3", "c1")

    async def test_queued_turns_are_bounded_per_owner(self, store: Store) -> None:
        for sid in ("q1", "q2"):
            await new_session(store, key(sid))
        await _enqueue(store, "q1", "a1")
        await _enqueue(store, "q2", "b1")
        await _enqueue(store, "q1", "a2")  # behind a1: the one queued turn allowed
        with pytest.raises(LimitExceeded):
            await _enqueue(store, "q2", "b2")
        assert [t.id for t in await store.list_turns(key("q2"))] == ["b1"]
        # Without limits (in-process callers) the per-session queue bound alone applies.
        await store.enqueue_turn(key("q2"), turn_id="b2", input="x", policy="enqueue")

    async def test_sessions_are_bounded_per_owner(self, store: Store) -> None:
        for sid in ("s1", "s2"):
            await store.create_session(key(sid), "assistant", max_sessions=2)
        with pytest.raises(LimitExceeded):
            await store.create_session(key("s3"), "assistant", max_sessions=2)
        assert await store.get_session(key("s3")) is None
        # Asking again for one that exists is no new session: it is returned at the bound.
        record, created = await store.create_session(
            key("s1"), "assistant", max_sessions=2, exist_ok=True
        )
        assert record.key == key("s1") and created is False
        await store.create_session(key("s3", owner="bob"), "assistant", max_sessions=2)
        # Deleting one makes room again.
        assert await store.delete_session(key("s2")) is True
        await store.create_session(key("s3"), "assistant", max_sessions=2)

    async def test_sessions_made_at_once_never_pass_the_owner_bound(self, store: Store) -> None:
        # Creations at once, for one owner: exactly the bound is made, the rest refused (on
        # PostgreSQL the count and the insert were two transactions, and both could see room).
        async def make(n: int) -> bool:
            try:
                await store.create_session(key(f"at-once-{n}"), "assistant", max_sessions=3)
            except LimitExceeded:
                return False
            return True

        made = await asyncio.gather(*(make(n) for n in range(16)))
        assert sum(made) == 3
        assert len(await store.list_sessions("acme", "alice", limit=50)) == 3

    async def test_the_owner_count_follows_every_change_of_a_turn(self, store: Store) -> None:
        # Whichever way a turn is queued, starts, parks, goes back to the queue, ends or goes
        # with its session, the owner's next admission sees what the owner holds now (the SQL
        # stores keep the count apart from the turns, so a path that forgot it would show).
        one = PrincipalLimits(running_turns=1)
        probe, probes = await new_session(store, key("probe")), itertools.count()

        async def room() -> bool:
            """Whether alice has no busy session: a probe turn admitted, then cancelled."""
            turn_id = f"probe-{next(probes)}"
            try:
                await store.enqueue_turn(
                    probe, turn_id=turn_id, input="x", policy="enqueue", limits=one
                )
            except LimitExceeded:
                return False
            assert await store.end_waiting_turn(probe, turn_id, "cancelled") is not None
            return True

        k = await new_session(store, key("w"))
        assert await room()
        lease = await running_turn(store, k, "w1")
        assert not await room()
        # Two turns of one session are one busy session until the last of them ends.
        await store.enqueue_turn(k, turn_id="w2", input="x", policy="enqueue")
        await store.end_turn(lease, "w1", TurnEnding("rolled_back", "rollback"), [], [ev(3)])
        assert not await room()
        assert await store.end_waiting_turn(k, "w2", "interrupt", status="interrupted")
        assert await room()
        await store.release_lease(lease)
        # Parked, it holds no slot; decided, it is queued again and holds one.
        await parked(store, k, "w3")
        assert await room()
        await store.decide(k, "w3", "c2", "approve", by="alice")
        assert not await room()
        # Resumed by an owner that dies: running until the next owner recovers it.
        doomed = await acquire(store, k, "node-b", ttl=0.05)
        await store.resume_turn(doomed, "w3", [ev(5)])
        assert not await room()
        await asyncio.sleep(0.15)
        [lost] = await store.recover(await acquire(store, k, "node-c"))
        assert (lost.status, lost.reason) == ("failed", "owner_lost")
        assert await room()
        # A session forgotten with its turns queued leaves no busy session behind.
        other = await new_session(store, key("gone", owner="carol"))
        await store.enqueue_turn(other, turn_id="g1", input="x", policy="enqueue")
        await store.enqueue_turn(other, turn_id="g2", input="x", policy="enqueue")
        carol = key("c2", owner="carol")
        await new_session(store, carol)
        with pytest.raises(LimitExceeded):
            await store.enqueue_turn(carol, turn_id="c1", input="x", policy="enqueue", limits=one)
        await store.forget_user("acme", "carol")
        await new_session(store, carol)
        await store.enqueue_turn(carol, turn_id="c1", input="x", policy="enqueue", limits=one)
