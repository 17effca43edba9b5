"""Session leases: one holder at a time, tokens that only grow, renewal, release, take-over.

The lease is how any number of processes agree who runs a session's turns (DESIGN §4). Expiry is
exercised with real time: leases of 50 ms and sleeps of 150 ms, so the store must compare lease
expiry against a clock that moves with the test process.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tether.errors import AgentChanged, LimitExceeded, SessionBusy, SessionNotFound, StaleLease
from tether.events import TURN_QUEUED, TURN_STARTED
from tether.records import (
    Idempotency,
    Item,
    Lease,
    NewItem,
    Policy,
    PrincipalLimits,
    SessionKey,
    Turn,
    TurnEnding,
)
from tether.store.capabilities import LeasingQueue, ReleasingEnd, StartingQueue
from tether.store.protocol import Store
from tether.store.rules import request_digest
from tether.testing.conformance._support import (
    CLOCK_SLACK,
    LONG_TTL,
    PAST_SHORT_TTL,
    SHORT_TTL,
    acquire,
    ev,
    key,
    new_session,
    running_turn,
    snapshot,
)


class LeasesConformance:
    """Acquiring, renewing, releasing and taking over session leases.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_acquire_while_held(self, store: Store) -> None:
        k = await new_session(store)
        before = time.time()
        a = await acquire(store, k, "node-a", LONG_TTL)
        assert (a.key, a.owner) == (k, "node-a")
        assert a.expires_at >= before + LONG_TTL - CLOCK_SLACK
        assert await store.acquire_lease(k, "node-b", LONG_TTL) is None
        assert await store.lease_holder(k) == "node-a"

    async def test_tokens_only_grow(self, store: Store) -> None:
        k = await new_session(store)
        tokens = []
        lease = await acquire(store, k, "node-a")
        tokens.append(lease.token)
        await store.release_lease(lease)
        lease = await acquire(store, k, "node-b")
        tokens.append(lease.token)
        taken = await store.take_over_lease(k, "node-c", LONG_TTL, "node-b")
        assert taken is not None
        tokens.append(taken.token)
        await store.release_lease(taken)
        short = await acquire(store, k, "node-d", SHORT_TTL)
        tokens.append(short.token)
        await asyncio.sleep(PAST_SHORT_TTL)
        tokens.append((await acquire(store, k, "node-e")).token)
        assert tokens == sorted(set(tokens)), tokens  # strictly increasing

    async def test_renew_leases_returns_only_current_ones(self, store: Store) -> None:
        k1, k2 = await new_session(store, key("s1")), await new_session(store, key("s2"))
        keep = await acquire(store, k1, "node-a", SHORT_TTL)
        lose = await acquire(store, k2, "node-a", SHORT_TTL)
        await asyncio.sleep(PAST_SHORT_TTL)
        await acquire(store, k2, "node-b")
        renewed = await store.renew_leases([keep, lose], LONG_TTL)
        assert [(r.key, r.owner, r.token) for r in renewed] == [(k1, "node-a", keep.token)]
        assert renewed[0].expires_at > keep.expires_at
        assert await store.lease_holder(k1) == "node-a"
        assert await store.acquire_lease(k1, "node-b", LONG_TTL) is None
        assert await store.lease_holder(k2) == "node-b"
        # A renewed lease still fences in its holder's writes.
        await running_turn(store, k1, "t1", lease=renewed[0])
        assert await store.renew_leases([], LONG_TTL) == []

    async def test_release_lease(self, store: Store) -> None:
        k = await new_session(store)
        a = await acquire(store, k, "node-a")
        await store.release_lease(a)
        assert await store.lease_holder(k) is None
        b = await acquire(store, k, "node-b")  # at once, no waiting for expiry
        assert b.token > a.token
        with pytest.raises(StaleLease):
            await running_turn(store, k, "t1", lease=a)

        # Releasing a stale lease does nothing to the current one.
        await store.release_lease(a)
        assert await store.lease_holder(k) == "node-b"
        assert await store.acquire_lease(k, "node-c", LONG_TTL) is None
        await store.start_turn(b, "t1", [NewItem("user", "hello")], [ev(2)])
        assert [t.token for t in await store.renew_leases([b], LONG_TTL)] == [b.token]

    async def test_a_lease_says_truly_whether_a_turn_was_left_running(self, store: Store) -> None:
        # A store may say, as it grants a lease, whether a turn was left running (the worker
        # then skips recovery when none was); what it says must be so, or a dead owner's turn
        # would stay running for good.
        k = await new_session(store)
        clean = await acquire(store, k, "node-a", SHORT_TTL)
        assert clean.left_running in (False, None)
        await store.release_lease(clean)
        await running_turn(store, k, "t1", owner="node-b", ttl=SHORT_TTL)
        await asyncio.sleep(PAST_SHORT_TTL)
        left = await acquire(store, k, "node-c", LONG_TTL)
        assert left.left_running in (True, None)
        assert [t.id for t in await store.recover(left)] == ["t1"]

    async def test_a_lease_tells_truly_its_queue_and_where_its_history_stands(
        self, store: Store
    ) -> None:
        # A store may tell, as it grants a lease, the session's active turns (the worker then
        # reads no queue after the turn it was handed) and the seq the next item gets (the
        # holder then takes up what its previous lease knew of the history when it is the one
        # that lease expected): both must be so, or a queued turn would wait for the next
        # lease, or a window would show a history the store no longer holds.
        k = await new_session(store)

        async def lease() -> Lease:
            got = await acquire(store, k, "node-a", LONG_TTL)
            await store.release_lease(got)
            return got

        def next_seq(seq: int | None) -> int | None:
            return seq if seq is None else seq + 1

        empty = await lease()
        assert empty.queue in ((), None)
        first = empty.history_seq
        t1 = await store.enqueue_turn(k, turn_id="t1", input="one", policy="enqueue")
        t2 = await store.enqueue_turn(k, turn_id="t2", input="two", policy="enqueue")
        queued = await lease()
        assert queued.queue in (None, (t1.id, t2.id))
        assert queued.history_seq == first  # turns are not items
        running = await acquire(store, k, "node-a", LONG_TTL)
        await store.start_turn(running, t1.id, [NewItem("user", "one")], [ev(2)])
        await store.release_lease(running)
        after_start = await lease()
        assert after_start.history_seq in (None, next_seq(first))
        assert after_start.queue in (None, (t1.id, t2.id))
        assert after_start.left_running in (True, None)  # its holder left t1 running
        # Ended without the lease (cancelled while queued): the seqs move past a gap.
        assert await store.end_waiting_turn(k, t2.id, "cancelled") is not None
        ender = await acquire(store, k, "node-a", LONG_TTL)
        await store.end_turn(ender, t1.id, TurnEnding("completed", "answered"), [], [ev(3)])
        await store.release_lease(ender)
        ended = await lease()
        assert ended.queue in ((), None)
        if ended.history_seq is not None:
            assert after_start.history_seq is not None
            assert ended.history_seq > after_start.history_seq
        # Cleared: the same.
        await store.clear_items(k)
        cleared = await lease()
        if cleared.history_seq is not None:
            assert ended.history_seq is not None
            assert cleared.history_seq > ended.history_seq

    async def test_a_turn_queued_on_an_idle_session_may_come_with_its_lease(
        self, store: Store
    ) -> None:
        # A store that can (LeasingQueue) takes the lease for the submitter in the admission's
        # transaction when it is free: the lease then is exactly what acquire_lease would give.
        if not isinstance(store, LeasingQueue):
            pytest.skip("this store takes leases by acquire_lease only")
        k = await new_session(store)
        first, lease = await store.enqueue_turn_leased(
            k, owner="node-a", ttl=LONG_TTL, turn_id="t1", input="one", policy="enqueue"
        )
        assert lease is not None and (lease.key, lease.owner) == (k, "node-a")
        assert await store.lease_holder(k) == "node-a"
        assert lease.queue in (None, (first.id,))
        assert lease.left_running in (False, None)
        assert lease.history_seq is None or lease.history_seq >= 1
        # Held: the next turn is only queued; the lease stays the first's.
        second, none = await store.enqueue_turn_leased(
            k, owner="node-b", ttl=LONG_TTL, turn_id="t2", input="two", policy="enqueue"
        )
        assert none is None and second.seq == first.seq + 1
        assert await store.lease_holder(k) == "node-a"
        await store.start_turn(lease, first.id, [NewItem("user", "one")], [ev(2)])
        # A refused admission takes nothing, and a retry's turn comes without a lease.
        await store.release_lease(lease)
        with pytest.raises(SessionBusy):
            await store.enqueue_turn_leased(
                k, owner="node-b", ttl=LONG_TTL, turn_id="t3", input="x", policy="reject"
            )
        assert await store.lease_holder(k) is None
        asked = Idempotency("key-1", request_digest("again", "enqueue", None))
        made, taken = await store.enqueue_turn_leased(
            k,
            owner="node-b",
            ttl=SHORT_TTL,
            turn_id="t4",
            input="again",
            policy="enqueue",
            idempotency=asked,
        )
        assert taken is not None and taken.token > lease.token
        await asyncio.sleep(PAST_SHORT_TTL)  # and an expired lease is free again
        again, retaken = await store.enqueue_turn_leased(
            k,
            owner="node-c",
            ttl=LONG_TTL,
            turn_id="t5",
            input="again",
            policy="enqueue",
            idempotency=asked,
        )
        assert again.id == made.id and retaken is None
        assert await store.lease_holder(k) is None

    async def test_a_turn_sent_under_a_held_lease_may_start_as_it_is_queued(
        self, store: Store
    ) -> None:
        # A store that can (StartingQueue) admits a turn under the submitter's lease and, with
        # nothing ahead of it, starts it in the same transaction, exactly as start_turn would.
        if not isinstance(store, StartingQueue):
            pytest.skip("this store starts turns by start_turn only")
        k = await new_session(store)
        lease = await acquire(store, k, "node-a")

        async def send(
            held: Lease,
            turn_id: str,
            text: str,
            *,
            policy: Policy = "enqueue",
            idempotency: Idempotency | None = None,
        ) -> tuple[Turn, list[Item] | None]:
            assert isinstance(store, StartingQueue)
            return await store.enqueue_turn_started(
                held,
                turn_id=turn_id,
                input=text,
                policy=policy,
                items=[NewItem("user", text)],
                events=[ev(2, TURN_STARTED, turn_id=turn_id)],
                idempotency=idempotency,
            )

        first, written = await send(lease, "t1", "one")
        assert first.status == "running" and first.started_at is not None
        assert written is not None and [(i.kind, i.content) for i in written] == [("user", "one")]
        stored = await store.get_turn(k, "t1")
        assert stored is not None and (stored.status, stored.seq) == ("running", first.seq)
        events = await store.list_events(k, "t1")
        assert [(e.seq, e.type) for e in events] == [(1, TURN_QUEUED), (2, TURN_STARTED)]
        stored_items = await store.list_items(k)
        assert [(i.seq, i.content) for i in stored_items] == [(written[0].seq, "one")]
        # Behind a running turn the next one is only queued, and writes nothing of its own.
        second, none = await send(lease, "t2", "two")
        assert none is None and second.status == "queued" and second.seq == first.seq + 1
        assert [i.content for i in await store.list_items(k)] == ["one"]
        assert [e.type for e in await store.list_events(k, "t2")] == [TURN_QUEUED]
        # A refused admission writes nothing.
        before = await snapshot(store, k)
        with pytest.raises(SessionBusy):
            await send(lease, "t3", "three", policy="reject")
        assert await snapshot(store, k) == before
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        # t2 is first now (queued): a new turn waits behind it rather than overtake it.
        third, none = await send(lease, "t3", "three")
        assert none is None and third.status == "queued"
        # A retry of a submission gets its first turn as it stands, and starts nothing.
        asked = Idempotency("key-1", request_digest("three", "enqueue", None))
        k2 = await new_session(store, key("s2"))
        lease2 = await acquire(store, k2, "node-a")
        made, started = await send(lease2, "u1", "three", idempotency=asked)
        assert started is not None and made.status == "running"
        await store.end_turn(lease2, "u1", TurnEnding("completed", "answered"), [], [ev(3)])
        again, none = await send(lease2, "u2", "three", idempotency=asked)
        assert none is None and again.id == "u1" and again.status == "completed"
        assert [i.content for i in await store.list_items(k2)] == ["three"]
        # Under a lost lease nothing is written at all: not even the admission.
        await store.release_lease(lease2)
        await acquire(store, k2, "node-b")
        before = await snapshot(store, k2)
        with pytest.raises(StaleLease):
            await send(lease2, "u3", "four")
        assert await snapshot(store, k2) == before

    async def test_a_turn_on_an_idle_session_may_be_leased_and_started_as_it_is_queued(
        self, store: Store
    ) -> None:
        # A store that can (StartingQueue) takes the free lease with the admission and, with
        # no other turn active, starts the turn under it in the same transaction.
        if not isinstance(store, StartingQueue):
            pytest.skip("this store starts turns by start_turn only")
        k = await new_session(store)

        async def send(
            session: SessionKey,
            turn_id: str,
            text: str,
            *,
            owner: str = "node-a",
            policy: Policy = "enqueue",
            idempotency: Idempotency | None = None,
            expect_agent: str | None = None,
            limits: PrincipalLimits | None = None,
        ) -> tuple[Turn, Lease | None, list[Item] | None]:
            assert isinstance(store, StartingQueue)
            return await store.enqueue_turn_taken(
                session,
                owner=owner,
                ttl=LONG_TTL,
                turn_id=turn_id,
                input=text,
                policy=policy,
                items=[NewItem("user", text)],
                events=[ev(2, TURN_STARTED, turn_id=turn_id)],
                idempotency=idempotency,
                expect_agent=expect_agent,
                limits=limits,
            )

        first, lease, written = await send(k, "t1", "one")
        assert lease is not None and (lease.owner, lease.queue) == ("node-a", ("t1",))
        assert lease.left_running is False and lease.history_seq == 1  # before "one"
        assert await store.lease_holder(k) == "node-a"
        assert first.status == "running" and first.started_at is not None
        assert written is not None and [(i.kind, i.content) for i in written] == [("user", "one")]
        stored = await store.get_turn(k, "t1")
        assert stored is not None and (stored.status, stored.seq) == ("running", first.seq)
        events = await store.list_events(k, "t1")
        assert [(e.seq, e.type) for e in events] == [(1, TURN_QUEUED), (2, TURN_STARTED)]
        assert [(i.seq, i.content) for i in await store.list_items(k)] == [(1, "one")]
        # The turn goes on under the lease taken, as one started by start_turn would.
        await store.append(lease, "t1", [NewItem("assistant", "re one")], [ev(3)])
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(4)])
        # While the lease is held, the next turn is only queued: no lease, nothing started.
        second, none, nothing = await send(k, "t2", "two", owner="node-b")
        assert (none, nothing, second.status) == (None, None, "queued")
        assert [e.type for e in await store.list_events(k, "t2")] == [TURN_QUEUED]
        # With the lease free and a turn already waiting, the lease is taken and the new
        # turn queued behind the waiting one.
        await store.release_lease(lease)
        third, taken, nothing = await send(k, "t3", "three", owner="node-b")
        assert nothing is None and third.status == "queued"
        assert taken is not None and taken.queue == ("t2", "t3")
        assert [i.content for i in await store.list_items(k)] == ["one", "re one"]
        # A refused admission writes nothing and takes nothing.
        await store.release_lease(taken)
        before = await snapshot(store, k)
        with pytest.raises(SessionBusy):
            await send(k, "t4", "four", policy="reject")
        assert await snapshot(store, k) == before
        assert await store.lease_holder(k) is None
        # A retry of a submission gets its first turn as it stands, and takes nothing.
        asked = Idempotency("key-1", request_digest("five", "enqueue", None))
        k2 = await new_session(store, key("s2"))
        made, held, started = await send(k2, "u1", "five", idempotency=asked)
        assert held is not None and started is not None and made.status == "running"
        await store.end_turn(held, "u1", TurnEnding("completed", "answered"), [], [ev(3)])
        await store.release_lease(held)
        again, none, nothing = await send(k2, "u2", "five", idempotency=asked)
        assert (again.id, again.status, none, nothing) == ("u1", "completed", None, None)
        assert await store.lease_holder(k2) is None
        # A lease that ran out with a turn left running is taken, and says so; the new turn
        # waits behind the one left (recovery ends it first), and starts nothing.
        k4 = await new_session(store, key("s4"))
        await running_turn(store, k4, "x1", owner="node-dead", ttl=SHORT_TTL)
        await asyncio.sleep(PAST_SHORT_TTL)
        behind, after_dead, nothing = await send(k4, "x2", "eight")
        assert nothing is None and behind.status == "queued"
        assert after_dead is not None and after_dead.left_running is True
        assert after_dead.queue == ("x1", "x2")
        assert [e.type for e in await store.list_events(k4, "x2")] == [TURN_QUEUED]
        with pytest.raises(SessionNotFound):
            await send(key("nobody"), "v1", "six")
        with pytest.raises(SessionNotFound):
            await send(key("nobody"), "v2", "six", expect_agent="assistant")
        # The agent the caller expects the session to name (new_session's "assistant"): a
        # session that names another refuses the turn, and writes and takes nothing.
        k3 = await new_session(store, key("s3"))
        before = await snapshot(store, k3)
        with pytest.raises(AgentChanged):
            await send(k3, "w1", "seven", expect_agent="someone-else")
        assert await snapshot(store, k3) == before
        assert await store.lease_holder(k3) is None
        made, held, started = await send(k3, "w2", "seven", expect_agent="assistant")
        assert held is not None and started is not None and made.status == "running"
        # The owner's bound holds here too: with its sessions busy, an idle one's turn is
        # refused, and nothing is written or taken.
        k5 = await new_session(store, key("s5"))
        before = await snapshot(store, k5)
        with pytest.raises(LimitExceeded):
            await send(k5, "y1", "nine", limits=PrincipalLimits(running_turns=1))
        assert await snapshot(store, k5) == before
        assert await store.lease_holder(k5) is None

    async def test_a_turn_may_end_and_give_its_lease_up_in_one_write(self, store: Store) -> None:
        # A store that can (ReleasingEnd) ends a turn as end_turn does and, with no other turn
        # of the session active, gives the lease up in the same transaction; with one, keeps it.
        if not isinstance(store, ReleasingEnd):
            pytest.skip("this store gives a lease up by release_lease only")
        done = TurnEnding("completed", "answered")
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="one")
        await store.enqueue_turn(k, turn_id="t2", input="two", policy="enqueue")
        ended, released = await store.end_turn_released(
            lease, "t1", done, [NewItem("assistant", "re one")], [ev(3)]
        )
        assert (ended.id, ended.status, released) == ("t1", "completed", False)
        assert await store.lease_holder(k) == "node-a"  # kept: t2 is left to run
        assert [t.id for t in await store.active_turns(k)] == ["t2"]
        assert [e.seq for e in await store.list_events(k, "t1")] == [1, 2, 3]
        # The last active turn's ending lets the lease go: the session is free for anyone,
        # and the next lease's token is past it.
        await store.start_turn(lease, "t2", [NewItem("user", "two")], [ev(2, TURN_STARTED)])
        ended, released = await store.end_turn_released(
            lease, "t2", done, [NewItem("assistant", "re two")], [ev(3)]
        )
        assert (ended.id, ended.status, released) == ("t2", "completed", True)
        assert await store.lease_holder(k) is None and await store.active_turns(k) == []
        stored = await store.get_turn(k, "t2")
        assert stored is not None and stored.status == "completed"
        assert [i.content for i in await store.list_items(k)] == ["one", "re one", "two", "re two"]
        b = await acquire(store, k, "node-b")
        assert b.token == lease.token + 1
        # Under a lease no longer held, nothing is written, and the holder's lease stays.
        await running_turn(store, k, "t3", lease=b)
        before = await snapshot(store, k)
        with pytest.raises(StaleLease):
            await store.end_turn_released(lease, "t3", done, [NewItem("assistant", "x")], [ev(3)])
        assert await snapshot(store, k) == before
        assert await store.lease_holder(k) == "node-b"

    async def test_take_over_lease(self, store: Store) -> None:
        k = await new_session(store)
        a = await running_turn(store, k, "t1", owner="node-a")
        assert await store.take_over_lease(k, "node-b", LONG_TTL, "node-x") is None
        assert await store.lease_holder(k) == "node-a"

        b = await store.take_over_lease(k, "node-b", LONG_TTL, "node-a")
        assert b is not None
        assert (b.key, b.owner, b.token) == (k, "node-b", a.token + 1)
        assert await store.lease_holder(k) == "node-b"
        # A second taker racing on the same dead owner loses.
        assert await store.take_over_lease(k, "node-c", LONG_TTL, "node-a") is None
        assert await store.lease_holder(k) == "node-b"
        before = await snapshot(store, k)
        with pytest.raises(StaleLease):
            await store.append(a, "t1", [NewItem("assistant", "zombie")], [ev(3)])
        assert await snapshot(store, k) == before
        assert [t.id for t in await store.recover(b)] == ["t1"]

    async def test_sessions_needing_work_without_a_live_lease(self, store: Store) -> None:
        held, expired, free, idle = (key(f"w-{n}") for n in range(4))
        for k in (held, expired, free, idle):
            await new_session(store, k)
        await running_turn(store, held, "t-held", ttl=LONG_TTL)
        await running_turn(store, expired, "t-expired", ttl=SHORT_TTL)
        await store.enqueue_turn(free, turn_id="t-free", input="x", policy="enqueue")
        await asyncio.sleep(PAST_SHORT_TTL)
        everything = set(await store.sessions_needing_work())
        assert everything == {held, expired, free}
        unowned = set(await store.sessions_needing_work(unowned_at=time.time()))
        assert unowned == {expired, free}
