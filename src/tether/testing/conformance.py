"""The store conformance suite: the behaviour every :class:`~tether.store.base.Store` must have.

One suite, run against every backend (DESIGN §5). The in-memory store is the runnable spec;
a backend conforms when all of these tests pass against it.

How a backend author uses it: subclass :class:`StoreConformance` in a test module pytest
collects, and provide a fixture named ``store`` that yields an **opened, empty** store, fresh
for every test, and closes it afterwards::

    from collections.abc import AsyncIterator
    from pathlib import Path

    import pytest

    from tether.store.protocol import Store
    from tether.testing.conformance import StoreConformance


    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
            s = MyStore(tmp_path / "db")
            await s.open()
            try:
                yield s
            finally:
                await s.close()

The tests are plain ``async def`` methods and the fixture is an async generator, so run them
with pytest-asyncio in ``asyncio_mode = "auto"`` (in strict mode, set
``pytestmark = pytest.mark.asyncio`` on the subclass and declare the fixture with
``pytest_asyncio.fixture``). Lease expiry is exercised with real time: leases of 50 ms and
sleeps of 150 ms, so the store must compare lease expiry against a clock that moves with the
test process.

This module imports only pytest and tether, so it can ship inside the package.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tether.errors import (
    Conflict,
    QueueFull,
    SessionBusy,
    SessionNotFound,
    StaleLease,
)
from tether.events import EventType
from tether.records import (
    ABORTED_TOOL_RESULT,
    Event,
    Item,
    Lease,
    NewEvent,
    NewItem,
    SessionKey,
    Turn,
    TurnEnding,
    Usage,
)
from tether.store.protocol import Store

SHORT_TTL = 0.05
"""A lease that expires during the test (seconds)."""
PAST_SHORT_TTL = 0.15
"""Long enough a sleep for a SHORT_TTL lease to have expired."""
LONG_TTL = 30.0
CLOCK_SLACK = 5.0
"""Tolerance when comparing a store's timestamps to this process's clock."""

Snapshot = tuple[list[Item], list[Turn], dict[str, list[Event]]]


def key(session_id: str = "s1", *, owner: str = "alice", tenant: str = "acme") -> SessionKey:
    return SessionKey(tenant, owner, session_id)


def ev(seq: int, type: EventType = "tool.result", **data: Any) -> NewEvent:
    return NewEvent(seq, type, dict(data))


def call(call_id: str, tool: str = "lookup") -> NewItem:
    return NewItem("tool_call", call_id=call_id, tool_name=tool, arguments='{"q": 1}')


def result(call_id: str, content: str = "ok", tool: str = "lookup") -> NewItem:
    return NewItem("tool_result", content, call_id=call_id, tool_name=tool)


async def new_session(store: Store, k: SessionKey | None = None) -> SessionKey:
    k = k or key()
    await store.create_session(k, "assistant")
    return k


async def acquire(
    store: Store, k: SessionKey, owner: str = "node-a", ttl: float = LONG_TTL
) -> Lease:
    lease = await store.acquire_lease(k, owner, ttl)
    assert lease is not None, f"{owner} could not acquire a free lease"
    return lease


async def running_turn(
    store: Store,
    k: SessionKey,
    turn_id: str,
    *,
    lease: Lease | None = None,
    owner: str = "node-a",
    ttl: float = LONG_TTL,
    text: str = "hello",
) -> Lease:
    """Queue ``turn_id`` and start it (user item, event seq 2) under ``lease`` or a new one."""
    await store.enqueue_turn(k, turn_id=turn_id, input=text, policy="enqueue")
    if lease is None:
        lease = await acquire(store, k, owner, ttl)
    await store.start_turn(lease, turn_id, [NewItem("user", text)], [ev(2, "turn.started")])
    return lease


async def snapshot(store: Store, k: SessionKey) -> Snapshot:
    """Everything the session holds, for checking that a rejected write changed nothing."""
    items = await store.list_items(k, limit=100_000)
    turns = await store.list_turns(k, limit=100_000)
    events = {t.id: await store.list_events(k, t.id) for t in turns}
    return items, turns, events


def ended_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == "turn.ended"]


class StoreConformance:
    """Every test receives ``store``: an opened, empty Store provided by the subclass."""

    # -- sessions ------------------------------------------------------------------------------
    async def test_ping(self, store: Store) -> None:
        await store.ping()

    async def test_create_and_get_session(self, store: Store) -> None:
        k = key()
        before = time.time()
        rec, created = await store.create_session(k, "assistant", metadata={"topic": "tax"})
        assert created is True
        assert rec.key == k
        assert rec.agent == "assistant"
        assert rec.metadata == {"topic": "tax"}
        assert rec.state == {}
        assert rec.revision == 1
        assert rec.expires_at is None
        assert before - CLOCK_SLACK <= rec.created_at <= time.time() + CLOCK_SLACK
        assert await store.get_session(k) == rec

    async def test_create_existing_session(self, store: Store) -> None:
        k = key()
        first, _ = await store.create_session(k, "assistant", metadata={"v": 1})
        again, created = await store.create_session(k, "other", metadata={"v": 2}, exist_ok=True)
        assert created is False
        assert again == first
        with pytest.raises(Conflict):
            await store.create_session(k, "other", metadata={"v": 3})
        assert await store.get_session(k) == first

    async def test_unknown_session(self, store: Store) -> None:
        k = key("nobody")
        assert await store.get_session(k) is None
        assert await store.get_turn(k, "t1") is None
        assert await store.list_events(k, "t1") == []
        assert await store.delete_session(k) is False
        with pytest.raises(SessionNotFound):
            await store.update_session(k, metadata={})
        with pytest.raises(SessionNotFound):
            await store.enqueue_turn(k, turn_id="t1", input="x", policy="enqueue")
        with pytest.raises(SessionNotFound):
            await store.list_items(k)
        with pytest.raises(SessionNotFound):
            await store.recent_items(k)
        with pytest.raises(SessionNotFound):
            await store.clear_items(k)
        with pytest.raises(SessionNotFound):
            await store.list_turns(k)
        with pytest.raises(SessionNotFound):
            await store.active_turns(k)
        with pytest.raises(SessionNotFound):
            await store.acquire_lease(k, "node-a", LONG_TTL)
        assert await store.list_sessions("acme", "alice") == []
        assert await store.sessions_needing_work() == []

    async def test_same_id_under_other_owner_or_tenant_is_another_session(
        self, store: Store
    ) -> None:
        mine, bobs, other_tenant = key("chat"), key("chat", owner="bob"), key("chat", tenant="z")
        await store.create_session(mine, "assistant", metadata={"who": "alice"})
        # Not a Conflict: these are different sessions that happen to share an id.
        _, created_b = await store.create_session(bobs, "helper", metadata={"who": "bob"})
        _, created_t = await store.create_session(other_tenant, "helper")
        assert created_b and created_t

        lease = await running_turn(store, mine, "t1")
        await store.append(lease, "t1", [NewItem("assistant", "secret")], [ev(3)])
        await store.update_session(mine, state={"n": 1})

        for other in (bobs, other_tenant):
            assert await store.list_items(other) == []
            assert await store.recent_items(other) == []
            assert await store.list_turns(other) == []
            assert await store.active_turns(other) == []
            assert await store.get_turn(other, "t1") is None
            assert await store.list_events(other, "t1") == []
            assert await store.lease_holder(other) is None
            # The other session's lease is free even though mine is held.
            assert await store.acquire_lease(other, "node-b", LONG_TTL) is not None
        bob_rec = await store.get_session(bobs)
        assert bob_rec is not None
        assert (bob_rec.agent, bob_rec.metadata, bob_rec.state) == ("helper", {"who": "bob"}, {})

        assert await store.delete_session(bobs) is True
        assert await store.delete_session(other_tenant) is True
        assert [i.content for i in await store.list_items(mine)] == ["hello", "secret"]
        assert await store.lease_holder(mine) == "node-a"
        assert (await store.get_session(mine)) is not None
        assert await store.sessions_needing_work() == [mine]

    async def test_list_sessions_only_the_owners_in_id_order(self, store: Store) -> None:
        for sid in ["b", "c", "a"]:
            await store.create_session(key(sid), "assistant")
        await store.create_session(key("0", owner="bob"), "assistant")
        await store.create_session(key("aa", tenant="other"), "assistant")
        listed = await store.list_sessions("acme", "alice")
        assert [r.key for r in listed] == [key("a"), key("b"), key("c")]
        assert [r.key.session_id for r in await store.list_sessions("acme", "bob")] == ["0"]
        assert await store.list_sessions("acme", "carol") == []

    async def test_list_sessions_pagination(self, store: Store) -> None:
        ids = [f"s-{n}" for n in range(23)] + ["a_b", "a.b", "Z", "s-1:x"]
        for sid in reversed(ids):
            await store.create_session(key(sid), "assistant")
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = await store.list_sessions("acme", "alice", limit=5, after=after)
            if not page:
                break
            assert len(page) <= 5
            pages.append([r.key.session_id for r in page])
            after = page[-1].key.session_id
        seen = [sid for page in pages for sid in page]
        assert seen == sorted(ids)  # every id once, in order: no duplicates, no gaps
        assert all(len(p) == 5 for p in pages[:-1])
        first = await store.list_sessions("acme", "alice", limit=3)
        assert [r.key.session_id for r in first] == sorted(ids)[:3]

    async def test_update_session(self, store: Store) -> None:
        k = key()
        rec, _ = await store.create_session(k, "assistant", metadata={"a": 1, "b": 2})
        up = await store.update_session(k, metadata={"c": 3}, expected_revision=rec.revision)
        assert up.metadata == {"c": 3}  # replaced, not merged
        assert up.state == {}
        assert up.revision == rec.revision + 1
        assert up.agent == "assistant" and up.created_at == rec.created_at
        assert up.updated_at >= rec.updated_at

        up2 = await store.update_session(k, state={"step": 2, "nested": {"x": [1, 2]}})
        assert up2.state == {"step": 2, "nested": {"x": [1, 2]}}
        assert up2.metadata == {"c": 3}  # untouched field kept
        assert up2.revision == rec.revision + 2
        up3 = await store.update_session(k, state={"other": True})
        assert up3.state == {"other": True}

        with pytest.raises(Conflict):
            await store.update_session(k, metadata={"lost": True}, expected_revision=rec.revision)
        assert await store.get_session(k) == up3

    async def test_ttl_sets_expires_at(self, store: Store) -> None:
        k = key()
        before = time.time()
        rec, _ = await store.create_session(k, "assistant", ttl_seconds=60)
        assert rec.expires_at is not None
        assert before + 60 - CLOCK_SLACK <= rec.expires_at <= time.time() + 60 + CLOCK_SLACK
        moved = await store.update_session(k, ttl_seconds=3600)
        assert moved.expires_at is not None
        assert moved.expires_at >= rec.expires_at + 3000
        kept = await store.update_session(k, metadata={"x": 1})
        assert kept.expires_at == moved.expires_at
        assert (await store.get_session(k)) == kept

    async def test_delete_session_removes_everything(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [NewItem("assistant", "hi")], [ev(3)])
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        assert await store.delete_session(k) is True
        assert await store.get_session(k) is None
        assert await store.get_turn(k, "t1") is None
        assert await store.get_turn(k, "t2") is None
        assert await store.list_events(k, "t1") == []
        assert await store.list_events(k, "t2") == []
        assert await store.sessions_needing_work() == []
        assert await store.delete_session(k) is False
        assert await store.list_sessions("acme", "alice") == []

        # Recreated under the same id, it starts empty.
        await new_session(store, k)
        assert await store.list_items(k) == []
        assert await store.list_turns(k) == []
        assert await store.active_turns(k) == []
        assert await store.get_turn(k, "t1") is None
        assert await store.list_events(k, "t1") == []
        assert await store.lease_holder(k) is None

    async def test_similar_ids_are_distinct_sessions(self, store: Store) -> None:
        # Characters with special meaning in LIKE patterns, regexes or prefixes must not merge.
        ids = ["a_b", "a.b", "aXb", "s-1", "s-10", "s-1:0", "S-1"]
        for n, sid in enumerate(ids):
            await store.create_session(key(sid), f"agent-{n}")
        for n, sid in enumerate(ids):
            rec = await store.get_session(key(sid))
            assert rec is not None and rec.agent == f"agent-{n}"

        lease = await running_turn(store, key("s-1"), "t1", text="for s-1")
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        for sid in ids:
            if sid != "s-1":
                assert await store.list_items(key(sid)) == []
                assert await store.list_turns(key(sid)) == []

        assert await store.delete_session(key("a_b")) is True
        assert await store.get_session(key("a.b")) is not None
        assert await store.get_session(key("aXb")) is not None
        assert await store.delete_session(key("s-1")) is True
        assert await store.get_session(key("s-10")) is not None
        assert await store.get_session(key("s-1:0")) is not None
        after = await store.list_sessions("acme", "alice", after="s-1")
        assert [r.key.session_id for r in after] == ["s-10", "s-1:0"]  # ':' sorts after '0'

    # -- turns ---------------------------------------------------------------------------------
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
            assert [(e.turn_id, e.seq, e.type) for e in events] == [(t.id, 1, "turn.queued")]
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
        await store.cancel_queued_turn(k, "t4", "cancelled")
        active = await store.active_turns(k)
        assert [(t.id, t.status) for t in active] == [
            ("t2", "running"),
            ("t3", "queued"),
            ("t5", "queued"),
        ]
        assert [t.seq for t in active] == [2, 3, 5]

    async def test_cancel_queued_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="a", policy="enqueue")
        await store.enqueue_turn(k, turn_id="t2", input="b", policy="enqueue")
        cancelled = await store.cancel_queued_turn(k, "t2", "cancelled")
        assert cancelled is not None
        assert (cancelled.id, cancelled.status, cancelled.reason) == (
            "t2",
            "cancelled",
            "cancelled",
        )
        assert cancelled.ended_at is not None and cancelled.ended
        assert await store.get_turn(k, "t2") == cancelled
        events = await store.list_events(k, "t2")
        assert [(e.seq, e.type) for e in events] == [(1, "turn.queued"), (2, "turn.ended")]
        assert events[1].data["status"] == "cancelled"
        assert events[1].data["reason"] == "cancelled"

        # Once ended, or once running, it is no longer this call's to cancel.
        assert await store.cancel_queued_turn(k, "t2", "caller_cancelled") is None
        assert len(ended_events(await store.list_events(k, "t2"))) == 1
        lease = await acquire(store, k)
        await store.start_turn(lease, "t1", [NewItem("user", "a")], [ev(2)])
        assert await store.cancel_queued_turn(k, "t1", "cancelled") is None
        t1 = await store.get_turn(k, "t1")
        assert t1 is not None and t1.status == "running"
        assert ended_events(await store.list_events(k, "t1")) == []
        assert await store.cancel_queued_turn(k, "nope", "internal_error") is None
        assert [t.id for t in await store.active_turns(k)] == ["t1"]

    # -- leases --------------------------------------------------------------------------------
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
                [ev(4, "turn.ended")],
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

    # -- fenced writes -------------------------------------------------------------------------
    async def test_start_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="hello", policy="enqueue")
        lease = await acquire(store, k)
        before = time.time()
        items = await store.start_turn(
            lease, "t1", [NewItem("user", "hello", meta={"lang": "en"})], [ev(2, "turn.started")]
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
        assert [(e.seq, e.type) for e in events] == [(1, "turn.queued"), (2, "turn.started")]

        before_snap = await snapshot(store, k)
        with pytest.raises(Conflict):
            await store.start_turn(lease, "t1", [NewItem("user", "again")], [ev(3)])
        with pytest.raises(Conflict):
            await store.start_turn(lease, "unknown", [NewItem("user", "x")], [ev(2)])
        assert await snapshot(store, k) == before_snap

    async def test_append(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        written = await store.append(
            lease,
            "t1",
            [NewItem("assistant", "let me look", complete=False), call("c1")],
            [ev(3, "message.completed", delta="let me look"), ev(4, "tool.call", call_id="c1")],
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
            (3, "message.completed", {"delta": "let me look"}),
            (4, "tool.call", {"call_id": "c1"}),
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

    async def test_item_seq_is_assigned_by_the_store_without_gaps(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [call("c1"), result("c1")], [ev(3)])
        await store.append(lease, "t1", [NewItem("assistant", "a")], [])
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(4)])
        await running_turn(store, k, "t2", lease=lease)
        await store.end_turn(
            lease,
            "t2",
            TurnEnding("completed", "answered"),
            [NewItem("assistant", "b"), NewItem("assistant", "c")],
            [ev(3)],
        )
        items = await store.list_items(k)
        assert [i.seq for i in items] == list(range(1, 8))
        assert [i.turn_id for i in items] == ["t1"] * 4 + ["t2"] * 3

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

    async def test_end_turn_completed_round_trips(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        usage = Usage(input_tokens=120, output_tokens=45, model_calls=2)
        ending = TurnEnding("completed", "answered", output="42", complete=True, usage=usage)
        done = await store.end_turn(
            lease, "t1", ending, [NewItem("assistant", "42")], [ev(3, "turn.ended", status="x")]
        )
        assert (done.status, done.reason, done.output, done.complete, done.error) == (
            "completed",
            "answered",
            "42",
            True,
            None,
        )
        assert done.usage == usage
        assert done.ended_at is not None and done.started_at is not None
        assert done.ended_at >= done.started_at
        assert (done.id, done.key, done.seq, done.input) == ("t1", k, 1, "hello")
        assert await store.get_turn(k, "t1") == done
        assert [i.content for i in await store.list_items(k)] == ["hello", "42"]
        assert [e.seq for e in await store.list_events(k, "t1")] == [1, 2, 3]
        assert await store.active_turns(k) == []

        # An ended turn cannot be ended, started or cancelled again.
        before = await snapshot(store, k)
        with pytest.raises(Conflict):
            await store.end_turn(lease, "t1", TurnEnding("failed", "caller_cancelled"), [], [ev(4)])
        with pytest.raises(Conflict):
            await store.start_turn(lease, "t1", [], [ev(4)])
        assert await store.cancel_queued_turn(k, "t1", "internal_error") is None
        assert await snapshot(store, k) == before

    async def test_end_turn_requires_a_running_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="x", policy="enqueue")
        lease = await acquire(store, k)
        before = await snapshot(store, k)
        for turn_id in ("t1", "unknown"):
            with pytest.raises(Conflict):
                await store.end_turn(
                    lease,
                    turn_id,
                    TurnEnding("completed", "answered"),
                    [NewItem("assistant", "x")],
                    [ev(2)],
                )
        assert await snapshot(store, k) == before

    async def test_end_turn_failed_excludes_its_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="first")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "one")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="second")
        await store.append(lease, "t2", [call("c1"), result("c1")], [ev(3)])
        failed = await store.end_turn(
            lease,
            "t2",
            TurnEnding("failed", "model_error", error="provider returned 500"),
            [NewItem("assistant", "partial", complete=False)],
            [ev(4, "turn.ended")],
        )
        assert (failed.status, failed.reason, failed.error) == (
            "failed",
            "model_error",
            "provider returned 500",
        )
        assert await store.get_turn(k, "t2") == failed
        items = await store.list_items(k)
        assert [(i.turn_id, i.excluded) for i in items] == [
            ("t1", False),
            ("t1", False),
            ("t2", True),
            ("t2", True),
            ("t2", True),
            ("t2", True),
        ]
        recent = await store.recent_items(k)
        assert [i.content for i in recent] == ["one", "first"]
        # Later turns' items are not excluded.
        await running_turn(store, k, "t3", lease=lease, text="third")
        assert [i.content for i in await store.recent_items(k)] == ["third", "one", "first"]

    async def test_end_turn_rolled_back_deletes_its_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="first")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "one")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="second")
        await store.append(lease, "t2", [NewItem("assistant", "half", complete=False)], [ev(3)])
        rolled = await store.end_turn(
            lease,
            "t2",
            TurnEnding("rolled_back", "rollback"),
            [NewItem("assistant", "more")],
            [ev(4, "turn.ended")],
        )
        assert (rolled.status, rolled.reason) == ("rolled_back", "rollback")
        assert await store.get_turn(k, "t2") == rolled
        assert [e.seq for e in await store.list_events(k, "t2")] == [1, 2, 3, 4]
        assert [(i.turn_id, i.content) for i in await store.list_items(k)] == [
            ("t1", "first"),
            ("t1", "one"),
        ]
        assert [i.content for i in await store.recent_items(k)] == ["one", "first"]

    async def test_partial_and_limit_endings_round_trip(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        ending = TurnEnding(
            "interrupted", "interrupt", output="half an ans", complete=False, usage=Usage(5, 3, 1)
        )
        t1 = await store.end_turn(
            lease, "t1", ending, [NewItem("assistant", "half an ans", complete=False)], [ev(3)]
        )
        assert (t1.status, t1.reason, t1.output, t1.complete, t1.usage) == (
            "interrupted",
            "interrupt",
            "half an ans",
            False,
            Usage(5, 3, 1),
        )
        items = await store.list_items(k)
        assert (items[-1].complete, items[-1].excluded) == (False, False)
        await running_turn(store, k, "t2", lease=lease)
        t2 = await store.end_turn(
            lease, "t2", TurnEnding("limit_reached", "max_iterations"), [], [ev(3)]
        )
        assert await store.get_turn(k, "t2") == t2
        assert (t2.status, t2.reason, t2.output) == ("limit_reached", "max_iterations", None)

    # -- reading history -----------------------------------------------------------------------
    async def test_recent_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="u1")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "a1")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="u2")
        await store.end_turn(
            lease,
            "t2",
            TurnEnding("failed", "internal_error"),
            [NewItem("assistant", "bad")],
            [ev(3)],
        )
        await running_turn(store, k, "t3", lease=lease, text="u3")
        await store.append(lease, "t3", [NewItem("assistant", "a3")], [ev(3)])
        # seqs: 1 u1, 2 a1, 3 u2 (excl), 4 bad (excl), 5 u3, 6 a3
        assert [i.seq for i in await store.recent_items(k)] == [6, 5, 2, 1]
        assert [i.seq for i in await store.recent_items(k, limit=2)] == [6, 5]
        assert [i.seq for i in await store.recent_items(k, before_seq=5, limit=2)] == [2, 1]
        assert [i.seq for i in await store.recent_items(k, before_seq=6)] == [5, 2, 1]
        assert [i.seq for i in await store.recent_items(k, before_seq=2)] == [1]
        assert await store.recent_items(k, before_seq=1) == []
        assert await store.recent_items(k, limit=0) == []
        items = {i.seq: i for i in await store.list_items(k)}
        assert await store.recent_items(k, limit=1) == [items[6]]

    async def test_list_items_pagination(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [NewItem("assistant", str(n)) for n in range(11)], [])
        everything = await store.list_items(k)
        assert [i.seq for i in everything] == list(range(1, 13))
        pages: list[Item] = []
        after = 0
        while page := await store.list_items(k, after_seq=after, limit=5):
            assert len(page) <= 5
            pages.extend(page)
            after = page[-1].seq
        assert pages == everything
        assert [i.seq for i in await store.list_items(k, after_seq=10)] == [11, 12]
        assert await store.list_items(k, after_seq=12) == []
        assert [i.seq for i in await store.list_items(k, limit=2)] == [1, 2]

    # -- recovery ------------------------------------------------------------------------------
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
        assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
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

    # -- maintenance ---------------------------------------------------------------------------
    async def test_clear_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        with pytest.raises(SessionBusy) as running_busy:
            await store.clear_items(k)
        assert running_busy.value.busy_turn_id == "t1"
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("summary", "s")], [ev(3)]
        )
        await store.enqueue_turn(k, turn_id="t2", input="x", policy="enqueue")
        with pytest.raises(SessionBusy) as queued_busy:
            await store.clear_items(k)
        assert queued_busy.value.busy_turn_id == "t2"
        assert len(await store.list_items(k)) == 2
        await store.cancel_queued_turn(k, "t2", "cancelled")

        assert await store.clear_items(k) == 2
        assert await store.list_items(k) == []
        assert await store.recent_items(k) == []
        assert [t.id for t in await store.list_turns(k)] == ["t1", "t2"]  # turns are kept
        assert await store.clear_items(k) == 0
        # Seqs are not reused, so a reader's cursor never points at a different item.
        await running_turn(store, k, "t3", lease=lease)
        assert [i.seq for i in await store.list_items(k)] == [3]

    async def test_sessions_needing_work(self, store: Store) -> None:
        idle, queued, running, ended = [
            await new_session(store, key(sid)) for sid in ("idle", "queued", "running", "ended")
        ]
        await store.enqueue_turn(queued, turn_id="q1", input="x", policy="enqueue")
        await running_turn(store, running, "r1")
        lease = await running_turn(store, ended, "e1")
        await store.end_turn(lease, "e1", TurnEnding("completed", "answered"), [], [ev(3)])
        await store.enqueue_turn(ended, turn_id="e2", input="x", policy="enqueue")
        await store.cancel_queued_turn(ended, "e2", "internal_error")
        await store.create_session(key("queued", owner="bob"), "assistant")
        needing = await store.sessions_needing_work()
        assert sorted(needing, key=lambda k: k.session_id) == [queued, running]
        assert idle not in needing

    async def test_list_events(self, store: Store) -> None:
        k = await new_session(store)
        foreign = [key("s1", owner="mallory"), key("s1", tenant="evil"), key("missing")]
        await new_session(store, foreign[0])
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [], [ev(n, "tool.result", n=n) for n in range(3, 9)])
        events = await store.list_events(k, "t1")
        assert [e.seq for e in events] == list(range(1, 9))
        assert all(e.turn_id == "t1" for e in events)
        assert events[5].data == {"n": 6}
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=6)] == [7, 8]
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=2, limit=3)] == [3, 4, 5]
        assert await store.list_events(k, "t1", after_seq=8) == []
        assert await store.list_events(k, "unknown") == []
        for other in foreign:
            assert await store.list_events(other, "t1") == []

    async def test_streamed_deltas_replay_one_by_one(self, store: Store) -> None:
        """Backends may pack text deltas; every delta still has its own seq for resume."""
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        words = [f"w{n} " for n in range(10)]
        batch = [ev(3 + n, "message.delta", text=w) for n, w in enumerate(words)]
        batch.append(ev(13, "tool.call", name="lookup"))
        batch += [ev(14 + n, "message.delta", text=f"x{n}") for n in range(3)]
        await store.append(lease, "t1", [], batch)
        await store.append(lease, "t1", [], [ev(17, "message.delta", text="tail")])
        events = await store.list_events(k, "t1")
        assert [e.seq for e in events] == list(range(1, 18))
        deltas = [e.data["text"] for e in events if e.type == "message.delta"]
        assert deltas == [*words, "x0", "x1", "x2", "tail"]
        for after in (0, 4, 7, 12, 13, 15, 16):
            resumed = await store.list_events(k, "t1", after_seq=after)
            assert [e.seq for e in resumed] == list(range(after + 1, 18)), after
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=5, limit=4)] == [
            6,
            7,
            8,
            9,
        ]
        before = await snapshot(store, k)
        with pytest.raises(Conflict):  # inside an earlier run of deltas
            await store.append(lease, "t1", [], [ev(8, "message.delta", text="again")])
        assert await snapshot(store, k) == before

    async def test_enqueue_on_an_expired_session_is_not_found(self, store: Store) -> None:
        k = key("short-lived")
        await store.create_session(k, "assistant", ttl_seconds=0.05)
        await asyncio.sleep(0.1)
        with pytest.raises(SessionNotFound):
            await store.enqueue_turn(k, turn_id="t1", input="late", policy="enqueue")
        assert await store.list_turns(k) == []

    async def test_cancel_requests_reach_the_owner(self, store: Store) -> None:
        k = await new_session(store)
        other = key("s1", owner="mallory")
        await new_session(store, other)
        await store.enqueue_turn(k, turn_id="queued-only", input="x", policy="enqueue")
        assert not await store.request_cancel(k, "queued-only", "cancelled", "cancelled")
        await store.cancel_queued_turn(k, "queued-only", "session_deleted")
        lease = await running_turn(store, k, "t1")
        assert await store.cancel_requests(["t1"]) == {}
        assert not await store.request_cancel(
            other, "t1", "cancelled", "client_disconnected"
        )  # not theirs
        assert await store.request_cancel(k, "t1", "interrupted", "interrupt")
        assert not await store.request_cancel(k, "t1", "cancelled", "shutdown")  # first one wins
        assert await store.cancel_requests(["t1", "unknown"]) == {
            "t1": ("interrupted", "interrupt")
        }
        assert await store.cancel_requests([]) == {}
        await store.end_turn(
            lease, "t1", TurnEnding("interrupted", "interrupt"), [], [ev(3, "turn.ended")]
        )
        assert not await store.request_cancel(k, "t1", "cancelled", "caller_cancelled")

    async def test_sweep_removes_only_expired_idle_sessions(self, store: Store) -> None:
        now = time.time()
        idle, busy, leased, fresh, forever = (key(f"sweep-{n}") for n in range(5))
        for k in (idle, busy, leased):
            await store.create_session(k, "assistant", ttl_seconds=0.05)
        await store.create_session(fresh, "assistant", ttl_seconds=3600)
        await store.create_session(forever, "assistant")
        await store.enqueue_turn(busy, turn_id="t-busy", input="x", policy="enqueue")
        await acquire(store, leased, ttl=LONG_TTL)
        await asyncio.sleep(0.1)
        assert await store.sweep_expired(time.time()) == 1
        assert await store.get_session(idle) is None
        for kept in (busy, leased, fresh, forever):
            assert await store.get_session(kept) is not None
        assert await store.sweep_expired(now) == 0

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
