"""Scheduler behaviour that the turn tests do not reach: admission, fencing, recovery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import StoreFactory, all_items, wait_until
from tether import Agent, QueueFull
from tether.errors import SessionNotFound, StaleLease
from tether.events import TURN_ENDED, TURN_QUEUED, TURN_STARTED
from tether.models.base import Finish, ModelEvent, ModelRequest, TextDelta, Usage
from tether.records import (
    LOCAL_PRINCIPAL,
    AgentRef,
    Item,
    Lease,
    NewEvent,
    NewItem,
    Principal,
    SessionKey,
    Turn,
)
from tether.runtime import Runtime
from tether.scheduler.owners import new_owner_id, owner_is_dead
from tether.store import InMemoryStore
from tether.store.capabilities import (
    ChangeCounter,
    LeasingQueue,
    ReleasingEnd,
    StartingQueue,
)
from tether.store.protocol import Store
from tether.store.sqlite import SQLiteStore
from tether.testing import ScriptedModel, Slow


async def test_full_queue_rejects_or_applies_backpressure(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(default=Slow("a b c", delay=0.05)))
    rt = Runtime(store, agents=[agent], max_queue=2)
    async with rt:
        key = SessionKey("local", "local", "q")
        await store.create_session(key, "a")
        turns = [await rt.scheduler.submit(key, "m0")]
        await wait_until(lambda: bool(rt.scheduler.running_turns()))
        turns += [await rt.scheduler.submit(key, f"m{n}") for n in (1, 2)]  # both queue
        with pytest.raises(QueueFull):
            await rt.scheduler.submit(key, "no room")
        # A caller willing to wait gets in once a turn ends; nothing was stored for the refusal.
        late = await rt.scheduler.submit(key, "patient", wait_for_slot=10)
        done = await rt.scheduler.wait(key, late.id)
        assert done.status == "completed"
        inputs = [t.input for t in await store.list_turns(key)]
        assert inputs == ["m0", "m1", "m2", "patient"]
        for t in turns:
            assert (await rt.scheduler.wait(key, t.id)).status == "completed"


async def test_waiting_callers_are_bounded(store: Store) -> None:
    # The first turn runs until cancelled, so the queue stays full for as long as the test says.
    model = ScriptedModel(Slow("x", delay=0.02, forever=True), default="ok")
    rt = Runtime(store, agents=[Agent(name="a", model=model)], max_queue=1)
    async with rt:
        key = SessionKey("local", "local", "w")
        await store.create_session(key, "a")
        running = await rt.scheduler.submit(key, "running")
        await wait_until(lambda: bool(rt.scheduler.running_turns()))
        await rt.scheduler.submit(key, "queued")
        waiter = asyncio.ensure_future(rt.scheduler.submit(key, "waits", wait_for_slot=30))
        await wait_until(lambda: rt.scheduler.local.slot_waiters.get(key) == 1)
        with pytest.raises(QueueFull):  # one waiter per queue slot, no more
            await rt.scheduler.submit(key, "one too many", wait_for_slot=30)
        assert not waiter.done()
        await rt.scheduler.cancel(key, running.id)  # a slot frees: the waiter gets in
        waited = await waiter
        assert (await rt.scheduler.wait(key, waited.id)).status == "completed"
        inputs = [t.input for t in await store.list_turns(key)]
        assert inputs == ["running", "queued", "waits"]


async def test_stolen_lease_stops_the_turn_without_writes(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(Slow("one two three four five six seven", delay=0.05, forever=True))
    agent = Agent(name="a", model=model)
    rt = Runtime(store, agents=[agent], lease_ttl=0.3)
    async with rt:
        key = SessionKey("local", "local", "fenced")
        await store.create_session(key, "a")
        turn = await rt.scheduler.submit(key, "go")
        await wait_until(lambda: bool(rt.scheduler.running_turns()))
        holder = await store.lease_holder(key)
        assert holder is not None
        # Another owner takes the session over (as a node that believed this one dead would).
        thief = await store.take_over_lease(key, "other-node", 60, holder)
        assert thief is not None
        before = await all_items(rt, key)
        with caplog.at_level(logging.WARNING, logger="tether.scheduler"):
            await wait_until(lambda: not rt.scheduler.running_turns(), within=5)
        assert "lease" in caplog.text
        # Nothing of the stale owner landed after the take-over, not even its ending.
        assert await all_items(rt, key) == before
        stored = await store.get_turn(key, turn.id)
        assert stored is not None and stored.status == "running"
        # The new owner recovers it honestly.
        recovered = await store.recover(thief)
        assert [(t.status, t.reason) for t in recovered] == [("failed", "owner_lost")]


class GatedModel:
    """Answers once the test opens its gate: a turn that runs for as long as the test needs."""

    name = "gated"
    context_window = 8192

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        self.entered.set()
        await self.gate.wait()
        yield TextDelta("finished at last")
        yield Usage(1, 3)
        yield Finish("stop")


async def test_heartbeats_keep_a_long_turns_lease_past_its_ttl(make_store: StoreFactory) -> None:
    """A turn running longer than ``lease_ttl`` keeps its lease: another worker on the same store
    never sees it as orphaned, cannot take the session, and the turn completes."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    ttl = 1.0  # renewed every ttl/3: a 0.67 s stall of this process would lose it
    model = GatedModel()
    agent = Agent(name="a", model=model)
    a = Runtime(make_store(), agents=[agent], lease_ttl=ttl)
    b = Runtime(make_store(), agents=[agent], lease_ttl=ttl)  # looks for orphans every ttl/2
    async with a, b:
        key = SessionKey("local", "local", "long")
        await a.store.create_session(key, "a")
        turn = await a.scheduler.submit(key, "take your time")
        async with asyncio.timeout(10):
            await model.entered.wait()
        lease = a.scheduler.lease_of(key)
        assert lease is not None
        # Let the first grant run out twice over: only renewals can keep the session now.
        while time.time() < lease.expires_at + 2 * ttl:  # noqa: ASYNC110 - time must pass
            await asyncio.sleep(0.05)
        assert await b.store.lease_holder(key) == a.scheduler.owner
        assert key not in await b.store.sessions_needing_work(unowned_at=time.time())
        assert await b.store.acquire_lease(key, b.scheduler.owner, ttl) is None
        assert a.scheduler.running_turns() and not b.scheduler.running_turns()
        model.gate.set()
        async with asyncio.timeout(10):
            done = await a.scheduler.wait(key, turn.id)
        events = await a.store.list_events(key, turn.id)
    assert (done.status, done.reason, done.output) == ("completed", "answered", "finished at last")
    # Nobody ran it a second time; and its ending, a write fenced by the lease's token, was
    # accepted: the lease it started with was renewed, never lost.
    assert [e.type for e in events].count("turn.started") == 1


def test_dead_owner_detection() -> None:
    import os
    import socket
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    host = socket.gethostname()
    assert owner_is_dead(f"n|{host}|{proc.pid}|abcd")
    assert not owner_is_dead(f"n|{host}|{os.getpid()}|abcd")
    assert not owner_is_dead(f"n|some-other-host|{proc.pid}|abcd")
    assert not owner_is_dead("garbage")
    assert LOCAL_PRINCIPAL.is_admin


async def test_worker_keeps_the_lease_briefly_between_turns(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    rt = Runtime(store, agents=[agent])
    async with rt:
        rt.scheduler.linger = 0.3
        key = SessionKey("local", "local", "linger")
        await store.create_session(key, "a")
        first = await rt.scheduler.submit(key, "one")
        await rt.scheduler.wait(key, first.id)
        held = await store.lease_holder(key)
        assert held == rt.scheduler.owner  # still ours, lingering
        lease = rt.scheduler.lease_of(key)
        assert lease is not None
        second = await rt.scheduler.submit(key, "two")
        await rt.scheduler.wait(key, second.id)
        again = rt.scheduler.lease_of(key)
        assert again is not None and again.token == lease.token  # reused, not re-acquired
        async with asyncio.timeout(5):  # given up once idle
            while await store.lease_holder(key) is not None:  # noqa: ASYNC110 - a store poll
                await asyncio.sleep(0.02)


async def test_two_schedulers_on_one_store_serialize_and_see_each_others_turns(
    make_store: StoreFactory,
) -> None:
    """Two runtimes on one database behave like two processes: one turn at a time, in order."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")

    def digest(request: ModelRequest) -> str:
        users = [m.content for m in request.messages if m.role == "user"]
        return f"saw [{', '.join(users[:-1])}] then {users[-1]}"

    agent = Agent(name="a", model=ScriptedModel(default=digest, context_window=100_000))
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        key = SessionKey("local", "local", "shared")
        await a.store.create_session(key, "a")

        async def one(rt: Runtime, n: int) -> str:
            turn = await rt.scheduler.submit(key, f"m{n}", wait_for_slot=60)
            async with asyncio.timeout(30):
                done = await rt.scheduler.wait(key, turn.id)
            assert done.status == "completed"
            return done.output or ""

        await asyncio.gather(*(one(a if n % 2 else b, n) for n in range(12)))
        items = await a.store.list_items(key, limit=100)
    assert [i.kind for i in items] == ["user", "assistant"] * 12
    earlier: list[str] = []
    for n in range(0, 24, 2):
        assert items[n + 1].content == f"saw [{', '.join(earlier)}] then {items[n].content}"
        earlier.append(items[n].content)


async def first_delta(rt: Runtime, key: SessionKey, turn_id: str) -> None:
    async with asyncio.timeout(10), contextlib.aclosing(rt.scheduler.events(key, turn_id)) as ev:
        async for event in ev:
            if event.type == "message.delta":
                return


async def test_cancel_and_interrupt_reach_a_turn_running_in_another_process(
    make_store: StoreFactory,
) -> None:
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    model = ScriptedModel(
        Slow("w " * 200, delay=0.02, forever=True),
        Slow("v " * 200, delay=0.02, forever=True),
        default="after",
    )
    agent = Agent(name="a", model=model)
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        key = SessionKey("local", "local", "remote-cancel")
        await a.store.create_session(key, "a")
        first = await a.scheduler.submit(key, "long one")
        await first_delta(a, key, first.id)
        async with asyncio.timeout(10):
            done = await b.scheduler.cancel(key, first.id)  # b does not run it: a does
        assert (done.status, done.reason) == ("cancelled", "cancelled")

        second = await a.scheduler.submit(key, "another long one")
        await first_delta(a, key, second.id)
        third = await b.scheduler.submit(key, "stop that", policy="interrupt")
        async with asyncio.timeout(10):
            ended = await b.scheduler.wait(key, second.id)
            after = await b.scheduler.wait(key, third.id)
        assert ended.status == "interrupted" and ended.complete is False
        assert after.status == "completed"
        items = await a.store.list_items(key, limit=100)
    assert [(i.kind, i.complete) for i in items] == [
        ("user", True),
        ("assistant", False),
        ("user", True),
        ("assistant", False),
        ("user", True),
        ("assistant", True),
    ]


async def test_expired_idle_sessions_are_swept(store: Store) -> None:
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    rt = Runtime(store, agents=[agent])
    rt.scheduler.sweep_interval = 0.05
    async with rt:
        gone, kept = SessionKey("local", "local", "ttl"), SessionKey("local", "local", "keep")
        await store.create_session(gone, "a", ttl_seconds=0.1)
        await store.create_session(kept, "a")
        async with asyncio.timeout(5):
            while await store.get_session(gone) is not None:  # noqa: ASYNC110 - a store poll
                await asyncio.sleep(0.02)
        assert await store.get_session(kept) is not None


async def test_a_turn_left_running_by_a_dead_owner_is_recovered_without_new_requests(
    store: Store,
) -> None:
    key = SessionKey("local", "local", "orphan")
    await store.open()
    await store.create_session(key, "a")
    await store.enqueue_turn(key, turn_id="t-orphan", input="hello", policy="enqueue")
    ghost = await store.acquire_lease(key, "ghost|elsewhere|1|x", 0.2)
    assert ghost is not None
    await store.start_turn(ghost, "t-orphan", [NewItem("user", "hello")], [])
    # The ghost never comes back. A runtime that never gets a request for this session still
    # ends the turn honestly once the ghost's lease has expired.
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    rt = Runtime(store, agents=[agent], lease_ttl=0.2)
    async with rt:
        async with asyncio.timeout(10):
            while True:
                turn = await store.get_turn(key, "t-orphan")
                assert turn is not None
                if turn.ended:
                    break
                await asyncio.sleep(0.02)
    assert (turn.status, turn.reason) == ("failed", "owner_lost")


async def _listeners(url: str, at_least: int) -> list[int]:
    """Pids of tether cancel listeners on this database, once there are ``at_least`` of them."""
    import asyncpg  # type: ignore[import-untyped]

    from tether.store.postgres import LISTENER_NAME

    conn = await asyncpg.connect(url)
    try:
        async with asyncio.timeout(15):
            while True:
                pids = await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE application_name = $1"
                    " AND datname = current_database()",
                    LISTENER_NAME,
                )
                if len(pids) >= at_least:
                    return [int(r["pid"]) for r in pids]
                await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_cancel_reaches_the_owner_by_notification_and_survives_a_lost_listener(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL a cancel is announced (LISTEN/NOTIFY), not found by polling.

    Both polls are set to a minute, so a turn that ends within the test's few seconds was told
    by a notification. Then the listeners' connections are killed: they come back by themselves
    and the next cancel is announced too.
    """
    import asyncpg

    from tether.scheduler import core as scheduler_module
    from tether.store.postgres import PostgresStore

    monkeypatch.setattr(scheduler_module, "CANCEL_POLL", 60.0)
    monkeypatch.setattr(scheduler_module, "CANCEL_FALLBACK", 60.0)
    model = ScriptedModel(default=Slow("w " * 500, delay=0.02, forever=True))
    agent = Agent(name="a", model=model)
    a = Runtime(PostgresStore(postgres_url), agents=[agent])
    b = Runtime(PostgresStore(postgres_url), agents=[agent])
    async with a, b:
        key = SessionKey("local", "local", "notified")
        await a.store.create_session(key, "a")
        before = await _listeners(postgres_url, 2)
        for round_ in range(2):
            turn = await a.scheduler.submit(key, f"long one {round_}")
            await first_delta(a, key, turn.id)
            async with asyncio.timeout(10):
                done = await b.scheduler.cancel(key, turn.id)  # a runs it; b asks
            assert (done.status, done.reason) == ("cancelled", "cancelled")
            if round_ == 0:
                conn = await asyncpg.connect(postgres_url)
                try:
                    for pid in before:
                        await conn.execute("SELECT pg_terminate_backend($1)", pid)
                finally:
                    await conn.close()
                after = await _listeners(postgres_url, 2)
                assert not set(after) & set(before)  # new connections, not the killed ones


async def test_a_turn_for_an_agent_not_served_ends_failed_and_forgets_it(store: Store) -> None:
    # The session names an agent this runtime does not serve (removed from the server since).
    rt = Runtime(store, agents=[Agent(name="served", model=ScriptedModel(default="hi"))])
    async with rt:
        key = SessionKey("local", "local", "orphan-agent")
        await store.create_session(key, "gone")
        # Submitted and not waited for, as POST …/turns with wait=false does.
        turns = [await rt.scheduler.submit(key, f"m{n}") for n in range(3)]
        async with asyncio.timeout(10):
            for turn in turns:
                while not ((t := await store.get_turn(key, turn.id)) and t.ended):  # noqa: ASYNC110 - a store poll
                    await asyncio.sleep(0.01)
        for turn in turns:
            done = await store.get_turn(key, turn.id)
            assert done is not None
            assert (done.status, done.reason) == ("failed", "agent_not_found")
            ended = [e for e in await store.list_events(key, turn.id) if e.type == "turn.ended"]
            assert [e.data["reason"] for e in ended] == ["agent_not_found"]
        # The ending released what this process kept for the turn: nothing is left behind
        # (before, each such turn stayed in the waiter table for the life of the process).
        assert not rt.scheduler.local.waiters


async def test_a_waiter_on_a_turn_another_process_runs_reads_it_only_when_the_store_moved(
    make_store: StoreFactory,
) -> None:
    """B accepted the turn, A (lingering on the session's lease) runs it. B learns of its end
    from the store: on SQLite A's commits ring B's doorbell, and B looks at PRAGMA data_version
    only then (it looked every 20 ms), reading the turn only when another process wrote, so a
    turn that waits on its model costs B nothing."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    agent = Agent(name="a", model=ScriptedModel(default="ok", delay=1.0))
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "waits-elsewhere")
        await a.sessions.create(key, "a")
        first = await a.scheduler.submit(key, "one")
        await a.scheduler.wait(key, first.id)
        calls: Counter[str] = Counter()
        store = b.scheduler.store
        for name in ("get_turn", "data_version"):
            if hasattr(store, name):
                setattr(store, name, _counted(calls, name, getattr(store, name)))
        second = await b.scheduler.submit(key, "two")
        async with asyncio.timeout(10):
            done = await b.scheduler.wait(key, second.id)
        assert done.status == "completed" and done.output == "ok"
        assert a.scheduler.lease_of(key) is not None  # A ran it
        if isinstance(store, ChangeCounter):
            # A second of model time: B looked once per ring (A's start, its end), where it
            # looked ~50 times before the doorbell, and read the turn only after A's writes.
            assert store.heard() is not None
            assert 1 <= calls["data_version"] <= 4
            assert calls["get_turn"] <= 4
        else:
            assert calls["get_turn"] <= 15  # PostgreSQL: a read every 100 ms


def _counted(
    calls: Counter[str], name: str, fn: Callable[..., Awaitable[Any]]
) -> Callable[..., Awaitable[Any]]:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return await fn(*args, **kwargs)

    return counted


async def test_a_lingering_worker_takes_a_turn_another_process_accepted(
    make_store: StoreFactory,
) -> None:
    """A worker lingering on its lease sees a turn accepted by another process at once (on
    SQLite: by PRAGMA data_version moving), not when its linger runs out."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0  # only a look at the store lets B's turn run in time
        key = SessionKey("local", "local", "linger-elsewhere")
        await a.sessions.create(key, "a")
        first = await a.scheduler.submit(key, "one")
        await a.scheduler.wait(key, first.id)
        lease = a.scheduler.lease_of(key)
        assert lease is not None  # lingering
        second = await b.scheduler.submit(key, "two")
        async with asyncio.timeout(10):
            done = await b.scheduler.wait(key, second.id)
        assert done.status == "completed"
        again = a.scheduler.lease_of(key)
        assert again is not None and again.token == lease.token  # A ran it, under its lease


async def test_sessions_lingering_on_sqlite_look_at_nothing_until_another_process_writes(
    make_store: StoreFactory,
) -> None:
    """Twenty sessions lingering on their leases cost no look at the store while no other
    process writes, but a safety look a second (they cost a look at PRAGMA data_version every
    50 ms between them before the doorbell, and one each every 50 ms before that). Another
    process's commit rings the store: one look at the data version for all twenty, then each
    looks at its own queue."""
    store = make_store()
    if not isinstance(store, ChangeCounter):
        pytest.skip("only a store with a data version (SQLite) is watched this way")
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        keys = [SessionKey("local", "local", f"lingers-{n}") for n in range(20)]
        for key in keys:
            await rt.sessions.create(key, "a")
            turn = await rt.scheduler.submit(key, "hi")
            await rt.scheduler.wait(key, turn.id)
        await asyncio.sleep(0.2)  # the last one's look after its turn
        assert all(rt.scheduler.lease_of(key) is not None for key in keys)
        calls: Counter[str] = Counter()
        for name in ("data_version", "active_turns"):
            setattr(store, name, _counted(calls, name, getattr(store, name)))
        await asyncio.sleep(0.8)
        # At most the safety look a second (for a writer that does not ring), and no queue.
        assert calls["data_version"] <= 1 and calls["active_turns"] == 0, calls
        calls.clear()
        other = make_store()  # another process on the same file
        await other.open()
        try:
            await other.create_session(SessionKey("local", "local", "elsewhere"), "a")
            for _ in range(200):
                if calls["active_turns"] >= 20:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)
        finally:
            await other.close()
        assert 1 <= calls["data_version"] <= 3
        assert calls["active_turns"] == 20
        # Still awake to this process's own turns, at once.
        turn = await rt.scheduler.submit(keys[3], "again")
        async with asyncio.timeout(5):
            assert (await rt.scheduler.wait(keys[3], turn.id)).status == "completed"


async def test_waiting_on_a_turn_this_process_runs_reads_nothing_from_the_store(
    make_store: StoreFactory,
) -> None:
    """A turn submitted here and run here: its end reaches the waiter as a signal, even when
    the worker had not taken the session's lease yet as the wait began (each turn of a
    session whose lease was given up: it was a look at the store and a read of the turn)."""
    store = make_store()
    if not isinstance(store, ChangeCounter):
        pytest.skip("only a store with a data version says that nobody else wrote meanwhile")
    agent = Agent(name="a", model=ScriptedModel(default="ok", delay=0.2))
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 0.0  # every turn takes the lease anew
        key = SessionKey("local", "local", "waits-here")
        await rt.sessions.create(key, "a")
        calls: Counter[str] = Counter()
        store.get_turn = _counted(calls, "get_turn", store.get_turn)  # type: ignore[method-assign,assignment]
        admission = rt.scheduler.admission
        starting = admission.starting
        # A store that starts a turn as it takes the lease (StartingQueue) hands both to the
        # worker before the submission returns: without that, the lease comes after.
        for taken in (False, True) if starting is not None else (False,):
            admission.starting = starting if taken else None
            for n in range(3):
                turn = await rt.scheduler.submit(key, f"turn {n}")
                if taken:
                    assert turn.status == "running"
                else:
                    assert rt.scheduler.lease_of(key) is None  # its worker has just started
                done = await rt.scheduler.wait(key, turn.id)
                assert done.status == "completed"
        assert calls["get_turn"] == 0


async def test_a_worker_recovers_only_a_session_its_store_did_not_see_clean(
    make_store: StoreFactory,
) -> None:
    """Each lease a worker takes is recovered first, unless the store said as it granted it
    that no turn was left running (SQLite: one round trip to its thread fewer a lease)."""
    store = make_store()
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    leases: list[Lease] = []
    recovered: list[Lease] = []
    acquire, recover = store.acquire_lease, store.recover

    async def acquiring(key: SessionKey, owner: str, ttl: float) -> Lease | None:
        lease = await acquire(key, owner, ttl)
        if lease is not None:
            leases.append(lease)
        return lease

    async def recovering(lease: Lease) -> list[Turn]:
        recovered.append(lease)
        return await recover(lease)

    store.acquire_lease = acquiring  # type: ignore[method-assign]
    store.recover = recovering  # type: ignore[method-assign]
    if isinstance(store, LeasingQueue):
        # Or taken with the turn's admission.
        enqueue = store.enqueue_turn_leased

        async def enqueuing(*args: Any, **kwargs: Any) -> tuple[Turn, Lease | None]:
            turn, lease = await enqueue(*args, **kwargs)
            if lease is not None:
                leases.append(lease)
            return turn, lease

        store.enqueue_turn_leased = enqueuing  # type: ignore[method-assign]
    if isinstance(store, StartingQueue):
        # Or taken with the turn's admission, and the turn started under it.
        taking = store.enqueue_turn_taken

        async def taken(*args: Any, **kwargs: Any) -> tuple[Turn, Lease | None, Any]:
            turn, lease, items = await taking(*args, **kwargs)
            if lease is not None:
                leases.append(lease)
            return turn, lease, items

        store.enqueue_turn_taken = taken  # type: ignore[method-assign]
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 0.0  # a lease for every turn
        key = SessionKey("local", "local", "recovers-once")
        await rt.sessions.create(key, "a")
        for n in range(3):
            turn = await rt.scheduler.submit(key, f"turn {n}")
            assert (await rt.scheduler.wait(key, turn.id)).status == "completed"
    assert leases
    unclean = {lease.token for lease in leases if lease.left_running is not False}
    # Nothing seen clean is recovered; every other lease is, but for one a worker may have
    # taken as the runtime closed (on PostgreSQL the listener's coming up kicks the sessions
    # held, and a late kick can start a worker that close() stops before it recovers).
    assert {lease.token for lease in recovered} <= unclean
    assert len(unclean) - len(recovered) <= 1
    if isinstance(store, SQLiteStore):
        assert not recovered  # it looks as it grants the lease: none was left running


async def test_on_postgresql_a_lingering_worker_hears_of_turns_queued_elsewhere(
    postgres_url: str,
) -> None:
    """On PostgreSQL a turn queued on a session another process holds is announced to it
    (LISTEN/NOTIFY): the lingering worker reads nothing while nothing comes, runs the turn
    at once when it does, and looks for itself while its listener is down."""
    import asyncpg

    from tether.store.postgres import PostgresStore

    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    a = Runtime(PostgresStore(postgres_url), agents=[agent])
    b = Runtime(PostgresStore(postgres_url), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "announced")
        await a.sessions.create(key, "a")
        listeners = await _listeners(postgres_url, 2)
        first = await a.scheduler.submit(key, "one")
        await a.scheduler.wait(key, first.id)
        lease = a.scheduler.lease_of(key)
        assert lease is not None  # lingering
        calls: Counter[str] = Counter()
        store = a.scheduler.store
        store.active_turns = _counted(calls, "active_turns", store.active_turns)  # type: ignore[method-assign,assignment]
        await asyncio.sleep(0.5)  # ten polls' worth of quiet
        assert calls["active_turns"] == 0
        # A turn A queues itself is no news to anyone: no NOTIFY (which would serialize every
        # commit of the database on PostgreSQL's notify lock).
        heard: list[str] = []
        watcher = await asyncpg.connect(postgres_url)
        await watcher.add_listener("tether_queued", lambda *args: heard.append(args[-1]))
        own = await a.scheduler.submit(key, "from a")
        await a.scheduler.wait(key, own.id)
        for n in range(2):
            turn = await b.scheduler.submit(key, f"from b {n}")
            async with asyncio.timeout(10):
                done = await b.scheduler.wait(key, turn.id)
            assert done.status == "completed"
            again = a.scheduler.lease_of(key)
            assert again is not None and again.token == lease.token  # A ran it, under its lease
            assert heard == ["local\x1flocal\x1fannounced"] * (n + 1)
            if n == 1:
                break
            # The listener's connection dies: A looks at the queue itself until it is back
            # (and once more then), and a turn B queues meanwhile is still A's to run.
            conn = await asyncpg.connect(postgres_url)
            try:
                for pid in listeners:
                    await conn.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await conn.close()
            await wait_until(lambda: calls["active_turns"] >= 3)  # polling
        await _listeners(postgres_url, 2)
        await asyncio.sleep(0.2)  # the feed is up again, and A has looked once
        quiet = calls["active_turns"]
        await asyncio.sleep(0.5)
        assert calls["active_turns"] == quiet
        await watcher.close()


async def test_on_postgresql_ending_a_parked_turn_elsewhere_frees_the_one_behind_it_at_once(
    postgres_url: str,
) -> None:
    """A turn parked at the head of its session's queue, ended by another process (a cancel,
    an interrupt), lets the turn behind it run: the lingering holder hears of it, rather than
    trusting its feed for the rest of its linger."""
    from tether import tool
    from tether.store.postgres import PostgresStore
    from tether.testing import Call, ToolCalls

    @tool(requires_approval=True)
    def launch(target: str) -> str:
        """Launch."""
        return f"launched {target}"

    def reply(request: ModelRequest) -> str | ToolCalls:
        last = request.messages[-1]
        if last.role == "user" and last.content.startswith("rocket"):
            return ToolCalls(Call("launch", {"target": "rocket"}))
        return "ok"

    def runtime() -> Runtime:
        agent = Agent(name="a", model=ScriptedModel(default=reply), tools=[launch])
        return Runtime(PostgresStore(postgres_url), agents=[agent])

    a, b = runtime(), runtime()
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "parked-ahead")
        await a.sessions.create(key, "a")
        await _listeners(postgres_url, 2)
        for policy in ("enqueue", "interrupt"):
            parked = await a.scheduler.submit(key, f"rocket {policy}")
            assert (await a.scheduler.wait(key, parked.id, until_input=True)).status == (
                "awaiting_input"
            )
            lease = a.scheduler.lease_of(key)
            assert lease is not None  # A lingers on it
            behind = await b.scheduler.submit(key, "next", policy=policy)
            if policy == "enqueue":
                await asyncio.sleep(0.2)  # A has looked: nothing it may run yet
                await b.scheduler.cancel(key, parked.id)
            async with asyncio.timeout(5):
                done = await b.scheduler.wait(key, behind.id)
            assert done.status == "completed"
            again = a.scheduler.lease_of(key)
            assert again is not None and again.token == lease.token  # A ran it


async def test_turns_in_a_row_under_one_lease_read_no_queue(make_store: StoreFactory) -> None:
    """A worker that has found its session's queue empty under its lease does not read it
    again after each turn while nothing can have changed it: a turn queued here is handed to
    it, one queued elsewhere is announced (PostgreSQL's feed) or moves the data version
    (SQLite), even while a turn runs."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store says nothing of other processes: it reads every time")
    agent = Agent(name="a", model=ScriptedModel(default="ok", delay=0.3))
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "in-a-row")
        await a.sessions.create(key, "a")
        if not isinstance(a.store, ChangeCounter):  # PostgreSQL: both feeds up first
            await _listeners(a.store.url, 2)  # type: ignore[attr-defined]
        for n in range(2):  # the lease's first read of the queue
            await a.scheduler.wait(key, (await a.scheduler.submit(key, f"warm {n}")).id)
        calls: Counter[str] = Counter()
        store = a.scheduler.store
        store.active_turns = _counted(calls, "active_turns", store.active_turns)  # type: ignore[method-assign,assignment]
        for n in range(4):
            await a.scheduler.wait(key, (await a.scheduler.submit(key, f"turn {n}")).id)
        assert calls["active_turns"] == 0
        # B queues a turn while A's runs: A reads its queue after the turn, runs B's next
        # under the same lease, and reads once more to find it empty (on SQLite B's own
        # looks at the lease may move the version, and A read a few times more).
        lease = a.scheduler.lease_of(key)
        mine = await a.scheduler.submit(key, "slow")
        await first_started(a, key, mine.id)
        theirs = await b.scheduler.submit(key, "queued elsewhere")
        async with asyncio.timeout(10):
            done = await b.scheduler.wait(key, theirs.id)
        assert done.status == "completed"
        again = a.scheduler.lease_of(key)
        assert lease is not None and again is not None and again.token == lease.token
        # (The read that finds the queue empty may come after B has seen its turn end.)
        await wait_until(lambda: calls["active_turns"] >= 2)
        if not isinstance(a.store, ChangeCounter):
            await asyncio.sleep(0.2)
            assert calls["active_turns"] == 2
        # Three turns queued here behind a running one: one is handed to the worker, and the
        # others make it read the queue again, so none is left behind.
        running = await a.scheduler.submit(key, "slow again")
        await first_started(a, key, running.id)
        behind = [await a.scheduler.submit(key, f"behind {n}") for n in range(3)]
        async with asyncio.timeout(10):
            for turn in behind:
                assert (await a.scheduler.wait(key, turn.id)).status == "completed"


async def first_started(rt: Runtime, key: SessionKey, turn_id: str) -> None:
    async with asyncio.timeout(10):
        while (t := await rt.store.get_turn(key, turn_id)) is None or t.status != "running":  # noqa: ASYNC110 - a store poll
            await asyncio.sleep(0.01)


async def test_a_session_made_again_under_a_lingering_lease_runs_its_turns(
    store: Store,
) -> None:
    """The worker of a deleted session still lingers on its lease when a session with the same
    id is made and given a turn: the old lease is stale for the new session, and the worker
    takes a new one instead of leaving the turn queued."""
    agent = Agent(name="a", model=ScriptedModel(default="again"))
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "made-again")
        await rt.sessions.create(key, "a")
        first = await rt.scheduler.submit(key, "one")
        await rt.scheduler.wait(key, first.id)
        assert rt.scheduler.lease_of(key) is not None  # lingering
        assert await rt.store.delete_session(key)
        await rt.sessions.create(key, "a")
        second = await rt.scheduler.submit(key, "two")
        async with asyncio.timeout(10):
            done = await rt.scheduler.wait(key, second.id)
        assert done.status == "completed" and done.output == "again"


async def test_a_turn_ended_elsewhere_just_before_its_start_is_skipped_not_fatal(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process cancels a waiting turn after this worker read the queue but before it
    started the turn: the store refuses the start, the turn keeps the ending recorded there,
    a follower sees that ending (not a start that never happened), and the worker goes on."""
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent]) as rt:
        # The worker's start, which a store that starts a turn with its admission skips.
        rt.scheduler.admission.starting = None
        key = SessionKey("local", "local", "raced")
        await store.create_session(key, "a")
        start_turn = store.start_turn
        seen: list[str] = []

        async def cancelled_first(
            lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
        ) -> list[Item]:
            if not seen:
                seen.append(turn_id)
                # What another process does meanwhile, without the lease.
                assert await store.end_waiting_turn(key, turn_id, "cancelled") is not None
            return await start_turn(lease, turn_id, items, events)

        store.start_turn = cancelled_first  # type: ignore[method-assign]
        followed: list[tuple[int, str]] = []

        async def follow(turn_id: str) -> None:
            async with contextlib.aclosing(rt.scheduler.events(key, turn_id)) as events:
                async for event in events:
                    followed.append((event.seq, event.type))

        with caplog.at_level(logging.ERROR, logger="tether.scheduler"):
            first = await rt.scheduler.submit(key, "never runs")
            follower = asyncio.create_task(follow(first.id))
            async with asyncio.timeout(10):
                done = await rt.scheduler.wait(key, first.id)
                await follower
            assert (done.status, done.reason) == ("cancelled", "cancelled")
            assert followed[-1][1] == "turn.ended"
            assert "turn.started" not in [t for _, t in followed]
            assert [s for s, _ in followed] == sorted({s for s, _ in followed})
            # The worker lives on: the next turn runs, under the same lease or a new one.
            second = await rt.scheduler.submit(key, "runs")
            async with asyncio.timeout(10):
                assert (await rt.scheduler.wait(key, second.id)).status == "completed"
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert [i.content for i in await store.list_items(key, limit=10)] == ["runs", "ok"]


async def test_a_turn_submitted_here_starts_without_a_read_of_the_queue(store: Store) -> None:
    """The worker lingering on the session's lease starts the turn a submit hands it: the
    store's refusal of an out-of-order start replaces the read of the queue before it."""
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "handed")
        await rt.sessions.create(key, "a")
        first = await rt.scheduler.submit(key, "one")
        await rt.scheduler.wait(key, first.id)
        calls: list[str] = []
        active_turns, start_turn = store.active_turns, store.start_turn

        async def counted_active(key: SessionKey) -> list[Turn]:
            calls.append("active_turns")
            return await active_turns(key)

        async def counted_start(
            lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
        ) -> list[Item]:
            calls.append(f"start {turn_id}")
            return await start_turn(lease, turn_id, items, events)

        store.active_turns = counted_active  # type: ignore[method-assign]
        store.start_turn = counted_start  # type: ignore[method-assign]
        if isinstance(store, StartingQueue):
            # This store starts it with its admission instead (the next test): go around that.
            rt.scheduler.admission.starting = None
        second = await rt.scheduler.submit(key, "two")
        async with asyncio.timeout(10):
            assert (await rt.scheduler.wait(key, second.id)).status == "completed"
        assert calls[0] == f"start {second.id}"


async def test_a_turn_sent_while_its_lease_lingers_here_is_started_as_it_is_admitted(
    store: Store,
) -> None:
    """A store that can (StartingQueue) admits and starts the turn submitted to a session
    whose lease lingers here in one write: the worker neither starts it nor reads the queue,
    and the turn is the same turn as one started the usual way."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    model = ScriptedModel(default=lambda r: f"re {r.messages[-1].content}")
    agent = Agent(name="a", model=model)
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "started")
        await rt.sessions.create(key, "a")
        first = await rt.scheduler.submit(key, "one")
        await rt.scheduler.wait(key, first.id)
        calls: list[str] = []
        for name in ("active_turns", "start_turn", "enqueue_turn", "enqueue_turn_leased"):
            setattr(store, name, _logged(calls, name, getattr(store, name)))
        started = store.enqueue_turn_started
        store.enqueue_turn_started = _logged(calls, "enqueue_turn_started", started)  # type: ignore[method-assign]
        second = await rt.scheduler.submit(key, "two")
        assert second.status == "running" and second.started_at is not None
        async with asyncio.timeout(10):
            done = await rt.scheduler.wait(key, second.id)
        assert (done.status, done.output) == ("completed", "re two")
        # (A store with no data version is read after each turn: nothing says nobody wrote.)
        expected = ["enqueue_turn_started"]
        assert calls == expected if isinstance(store, ChangeCounter) else calls[:1] == expected
        assert "start_turn" not in calls
        events = await store.list_events(key, second.id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert [e.type for e in events][:2] == [TURN_QUEUED, TURN_STARTED]
        assert events[-1].type == TURN_ENDED
        history = [(i.kind, i.content) for i in await store.list_items(key)]
        assert history == [
            ("user", "one"),
            ("assistant", "re one"),
            ("user", "two"),
            ("assistant", "re two"),
        ]
        # The model saw the whole conversation: the history the lease knew, and the new item.
        assert [m.content for m in model.requests[-1].messages[-3:]] == ["one", "re one", "two"]


async def test_a_turn_on_an_idle_session_is_leased_and_started_as_it_is_admitted(
    store: Store,
) -> None:
    """A store that can (StartingQueue) takes the free lease of an idle session with the
    turn's admission and starts the turn under it in the same write: the worker neither
    acquires a lease nor starts the turn, and the turn is the same as one started the usual
    way."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    model = ScriptedModel(default=lambda r: f"re {r.messages[-1].content}")
    agent = Agent(name="a", model=model)
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 0.0  # every turn finds the session idle
        key = SessionKey("local", "local", "taken")
        await rt.sessions.create(key, "a")
        calls: list[str] = []
        for name in (
            "acquire_lease",
            "active_turns",
            "start_turn",
            "enqueue_turn",
            "enqueue_turn_leased",
            "enqueue_turn_taken",
            "end_turn",
            "end_turn_released",
            "release_lease",
        ):
            if hasattr(store, name):
                setattr(store, name, _logged(calls, name, getattr(store, name)))
        for text in ("one", "two"):
            calls.clear()
            turn = await rt.scheduler.submit(key, text)
            assert turn.status == "running" and turn.started_at is not None
            async with asyncio.timeout(10):
                done = await rt.scheduler.wait(key, turn.id)
            assert (done.status, done.output) == ("completed", f"re {text}")
            await wait_until(lambda: rt.scheduler.lease_of(key) is None)
            if isinstance(store, ReleasingEnd):
                assert await store.lease_holder(key) is None  # given up with the ending
            # (A store with no data version is read after each turn: nothing says nobody
            # wrote.) A store that can gives the lease up with the turn's ending.
            if isinstance(store, ReleasingEnd):
                expected = ["enqueue_turn_taken", "end_turn_released"]
            else:
                expected = ["enqueue_turn_taken", "end_turn", "release_lease"]
            if isinstance(store, ChangeCounter):
                assert calls == expected
            else:
                assert [c for c in calls if c != "active_turns"] == expected
            events = await store.list_events(key, turn.id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert [e.type for e in events][:2] == [TURN_QUEUED, TURN_STARTED]
            assert events[-1].type == TURN_ENDED
        history = [(i.kind, i.content) for i in await store.list_items(key)]
        assert history == [
            ("user", "one"),
            ("assistant", "re one"),
            ("user", "two"),
            ("assistant", "re two"),
        ]
        assert [m.content for m in model.requests[-1].messages[-3:]] == ["one", "re one", "two"]


@pytest.mark.parametrize("hold", ["before", "after"])
async def test_a_turn_sent_as_the_last_one_ends_and_lets_the_lease_go_runs(
    store: Store, hold: str
) -> None:
    """A store that can (ReleasingEnd) gives the lease up with a turn's ending when nothing
    else is left: a turn sent while that ending is on its way to the store (held before it
    reaches the store, or after it committed and before the worker hears) is not lost. Sent
    first, it is queued behind the ending turn, and the ending keeps the lease for it; sent
    after, it takes the free lease itself. Either way it runs, once, after the first, and the
    session is free at the end."""
    if not isinstance(store, ReleasingEnd):
        pytest.skip("this store gives a lease up by release_lease only")
    model = ScriptedModel(default=lambda r: f"re {r.messages[-1].content}")
    async with Runtime(store, agents=[Agent(name="a", model=model)]) as rt:
        assert rt.scheduler.linger == 0.0  # the default with such a store
        key = SessionKey("local", "local", f"let-go-{hold}")
        await rt.sessions.create(key, "a")
        reached, go = asyncio.Event(), asyncio.Event()
        releasing = store.end_turn_released
        outcomes: list[bool] = []

        async def held(*args: Any, **kwargs: Any) -> tuple[Turn, bool]:
            if hold == "before" and not outcomes:
                reached.set()
                await go.wait()
            done = await releasing(*args, **kwargs)
            outcomes.append(done[1])
            if hold == "after" and len(outcomes) == 1:
                reached.set()
                await go.wait()
            return done

        store.end_turn_released = held  # type: ignore[method-assign]
        first = await rt.scheduler.submit(key, "one")
        async with asyncio.timeout(10):
            await reached.wait()
            assert rt.scheduler.lease_of(key) is None  # letting go: a new turn goes the usual way
            second = await asyncio.create_task(rt.scheduler.submit(key, "two"))
            go.set()
            ends = [await rt.scheduler.wait(key, t.id) for t in (first, second)]
            await wait_until(lambda: rt.scheduler.lease_of(key) is None)
        assert [(t.status, t.output) for t in ends] == [
            ("completed", "re one"),
            ("completed", "re two"),
        ]
        # Held before: the first ending found the second turn queued and kept the lease.
        # Held after: the first let it go, and the second took it as it was admitted.
        assert outcomes == ([False, True] if hold == "before" else [True, True])
        assert await store.lease_holder(key) is None
        history = [(i.kind, i.content) for i in await store.list_items(key)]
        assert history == [
            ("user", "one"),
            ("assistant", "re one"),
            ("user", "two"),
            ("assistant", "re two"),
        ]
        assert [m.content for m in model.requests[-1].messages[-3:]] == ["one", "re one", "two"]


async def test_a_turn_queued_elsewhere_as_the_holder_ends_keeps_the_lease_for_it(
    make_store: StoreFactory,
) -> None:
    """A turn accepted by another process while the holder's ending (which offers to give
    the lease up) is on its way: the store keeps the lease for it, and the holder runs it
    next, having read its queue, though nothing announced the turn to it while its lease was
    being let go (on PostgreSQL the feed's notice reaches no held session then)."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    model_a = ScriptedModel(default=lambda r: f"a: {r.messages[-1].content}")
    model_b = ScriptedModel(default=lambda r: f"b: {r.messages[-1].content}")
    a = Runtime(make_store(), agents=[Agent(name="a", model=model_a)])
    b = Runtime(make_store(), agents=[Agent(name="a", model=model_b)])
    async with a, b:
        store = a.scheduler.store
        if not isinstance(store, ReleasingEnd):
            pytest.skip("this store gives a lease up by release_lease only")
        key = SessionKey("local", "local", "kept-for-elsewhere")
        await a.sessions.create(key, "a")
        reached, go = asyncio.Event(), asyncio.Event()
        releasing = store.end_turn_released
        outcomes: list[bool] = []

        async def held(*args: Any, **kwargs: Any) -> tuple[Turn, bool]:
            if not outcomes:
                reached.set()
                await go.wait()
            done = await releasing(*args, **kwargs)
            outcomes.append(done[1])
            return done

        store.end_turn_released = held  # type: ignore[method-assign]
        first = await a.scheduler.submit(key, "one")
        async with asyncio.timeout(10):
            await reached.wait()
            second = await b.scheduler.submit(key, "two")
            assert second.status == "queued"  # A holds the lease in the store
            go.set()
            ends = [await a.scheduler.wait(key, first.id), await b.scheduler.wait(key, second.id)]
        assert [(t.status, t.output) for t in ends] == [
            ("completed", "a: one"),
            ("completed", "a: two"),  # run by A, under the lease its ending kept
        ]
        assert outcomes == [False, True]
        assert model_b.requests == []
        # (B's own worker, started as B queued the turn, may take the free lease a moment to
        # find nothing left to run.)
        async with asyncio.timeout(5):
            while await store.lease_holder(key) is not None:  # noqa: ASYNC110 - polls the store
                await asyncio.sleep(0.01)


async def test_a_caller_gone_during_a_leased_start_leaves_a_turn_that_runs(
    store: Store,
) -> None:
    """The lease the admission took and the turn it started reach the session's worker as
    the write settles, not when the caller comes back for them: a caller cancelled meanwhile
    (a client that disconnected) leaves a turn that runs to its end, not one left running
    with nobody running it until its lease runs out."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    agent = Agent(name="a", model=ScriptedModel(default="ran"))
    async with Runtime(store, agents=[agent]) as rt:
        key = SessionKey("local", "local", "caller-gone")
        await rt.sessions.create(key, "a")
        taking = store.enqueue_turn_taken
        entered, go, settled = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def slow(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            await go.wait()
            try:
                return await taking(*args, **kwargs)
            finally:
                settled.set()

        store.enqueue_turn_taken = slow  # type: ignore[method-assign]
        caller = asyncio.create_task(rt.scheduler.submit(key, "left behind"))
        await entered.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        go.set()
        await settled.wait()
        [turn] = await store.list_turns(key)
        assert turn.started_at is not None  # started with its admission
        async with asyncio.timeout(10):
            done = await rt.scheduler.wait(key, turn.id)
        assert (done.status, done.output) == ("completed", "ran")


@pytest.mark.parametrize("made_here", [False, True])
async def test_a_turn_for_the_sessions_own_agent_reads_the_session_at_most_once(
    store: Store, made_here: bool
) -> None:
    """A door that names no agent (own_agent) pins the session's. The name, read for the first
    such turn (or known from the session's creation here), is confirmed by the admission that
    takes the lease, and serves the turns admitted under that lease, each admitted and started
    in one write with no read."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "own-agent")
        if made_here:
            await rt.sessions.create(key, "a")
        else:
            await store.create_session(key, "a")  # as another process would
        calls: list[str] = []
        for name in (
            "get_session",
            "start_turn",
            "enqueue_turn_leased",
            "enqueue_turn_taken",
            "enqueue_turn_started",
        ):
            setattr(store, name, _logged(calls, name, getattr(store, name)))

        def own(name: str) -> AgentRef:
            return rt.served(name).ref

        turns = []
        for text in ("one", "two", "three"):
            turn = await rt.scheduler.submit(key, text, own_agent=own)
            turns.append(await rt.scheduler.wait(key, turn.id))
        assert [t.status for t in turns] == ["completed"] * 3
        assert {t.agent for t in turns} == {agent.ref}
        # The first takes the lease with its admission and is started with it; the others,
        # sent while the lease lingers, are started as they are admitted.
        expected = ["enqueue_turn_taken", "enqueue_turn_started", "enqueue_turn_started"]
        assert calls == expected if made_here else calls == ["get_session", *expected]


async def test_a_sessions_own_agent_is_read_once_and_confirmed_by_each_admission(
    store: Store,
) -> None:
    """A session's own agent, read once here, serves its next turns on new leases too: the
    admission that takes the lease confirms it, and, when the session names another agent
    (deleted and made anew meanwhile), writes nothing and the session is read again."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    agents = [
        Agent(name="a", model=ScriptedModel(default="from a")),
        Agent(name="b", model=ScriptedModel(default="from b")),
    ]
    async with Runtime(store, agents=agents) as rt:
        rt.scheduler.linger = 0.0  # every turn takes the lease anew
        key = SessionKey("local", "local", "own-agent-known")
        await store.create_session(key, "a")  # as another process would: not known here
        calls: list[str] = []
        for name in ("get_session", "enqueue_turn_taken"):
            setattr(store, name, _logged(calls, name, getattr(store, name)))

        def own(name: str) -> AgentRef:
            return rt.served(name).ref

        async def send(text: str) -> Turn:
            turn = await rt.scheduler.submit(key, text, own_agent=own)
            async with asyncio.timeout(10):
                done = await rt.scheduler.wait(key, turn.id)
            await wait_until(lambda: rt.scheduler.lease_of(key) is None)
            return done

        assert [(await send(t)).output for t in ("one", "two", "three")] == ["from a"] * 3
        assert calls == ["get_session"] + ["enqueue_turn_taken"] * 3
        calls.clear()
        assert await store.delete_session(key)
        await store.create_session(key, "b")
        assert (await send("four")).output == "from b"
        # Refused for the agent it expected ("a"), then read, then admitted for "b".
        assert calls == ["enqueue_turn_taken", "get_session", "enqueue_turn_taken"]
        assert [i.content for i in await store.list_items(key)] == ["four", "from b"]


async def test_a_session_made_anew_elsewhere_under_a_lingering_lease_runs_its_own_agent(
    make_store: StoreFactory,
) -> None:
    """A knows the session's agent under its lingering lease; B deletes the session and makes
    it anew for another agent. A's next turn for the session's own agent fails the lease's
    fence, reads the session afresh and runs the new session's agent."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    agents = [
        Agent(name="a", model=ScriptedModel(default="from a")),
        Agent(name="b", model=ScriptedModel(default="from b")),
    ]
    a, b = Runtime(make_store(), agents=agents), Runtime(make_store(), agents=agents)
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "made-anew")
        await a.sessions.create(key, "a")

        def own(name: str) -> AgentRef:
            return a.served(name).ref

        for text in ("one", "two"):  # the second is admitted under the lingering lease
            turn = await a.scheduler.submit(key, text, own_agent=own)
            assert (await a.scheduler.wait(key, turn.id)).output == "from a"
        assert a.scheduler.lease_of(key) is not None
        # A's lingering worker looks at its queue when B's writes ring it: held until B has
        # made the session anew, that look finds it (with no turn), and the lease lingers on,
        # stale, so the next turn goes through the fence.
        b_done = asyncio.Event()
        active_turns = a.store.active_turns

        async def after_b(k: SessionKey) -> list[Turn]:
            await b_done.wait()
            return await active_turns(k)

        refused: list[type[BaseException]] = []
        started = a.store.enqueue_turn_started  # type: ignore[attr-defined]

        async def fenced(*args: Any, **kwargs: Any) -> Any:
            try:
                return await started(*args, **kwargs)
            except Exception as exc:
                refused.append(type(exc))
                raise

        a.store.active_turns = after_b  # type: ignore[method-assign,assignment]
        a.store.enqueue_turn_started = fenced  # type: ignore[attr-defined]
        assert await b.sessions.delete(key)
        await b.sessions.create(key, "b")
        b_done.set()
        turn = await a.scheduler.submit(key, "three", own_agent=own)
        assert refused == [StaleLease]
        async with asyncio.timeout(10):
            done = await a.scheduler.wait(key, turn.id)
        assert (done.status, done.output, done.agent) == ("completed", "from b", agents[1].ref)
        assert [i.content for i in await a.store.list_items(key)] == ["three", "from b"]


def _logged(calls: list[str], name: str, fn: Any) -> Any:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return await fn(*args, **kwargs)

    return counted


async def test_a_handed_turn_behind_one_accepted_elsewhere_waits_its_turn(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process accepted a turn (no worker here knows of it) just before this one was
    submitted here: the worker handed the later turn has its start refused, reads the queue,
    and runs the earlier turn first. Order is the store's, whatever the worker was handed."""
    model = ScriptedModel(default=lambda r: f"after {r.messages[-1].content}")
    agent = Agent(name="a", model=model)
    async with Runtime(store, agents=[agent]) as rt:
        key = SessionKey("local", "local", "handed-late")
        await rt.sessions.create(key, "a")
        with caplog.at_level(logging.ERROR, logger="tether.scheduler"):
            elsewhere = await store.enqueue_turn(
                key, turn_id="elsewhere", input="first", policy="enqueue"
            )
            here = await rt.scheduler.submit(key, "second")
            async with asyncio.timeout(10):
                done_here = await rt.scheduler.wait(key, here.id)
                done_elsewhere = await rt.scheduler.wait(key, elsewhere.id)
        assert (done_elsewhere.status, done_here.status) == ("completed", "completed")
        assert done_elsewhere.started_at is not None and done_here.started_at is not None
        assert done_elsewhere.ended_at is not None
        assert done_elsewhere.ended_at <= done_here.started_at
        items = [i.content for i in await store.list_items(key, limit=10)]
        assert items == ["first", "after first", "second", "after second"]
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_on_sqlite_news_from_another_process_comes_by_the_doorbell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runtimes on one SQLite file (two processes, as ``tether serve --workers 2`` runs
    them): a cancel one takes for a turn the other runs, a turn one accepts on a session the
    other lingers on, and the end of that turn, which the first waits for, all reach the other
    side by the doorbell. Every poll is set to a minute, so what lands within seconds was rung
    (before the doorbell, polls of 20-50 ms carried it, and looked while nothing happened)."""
    from tether.scheduler import core, linger, news

    for module, name in (
        (core, "CANCEL_POLL"),
        (core, "CANCEL_FALLBACK"),
        (core, "CROSS_PROCESS_POLL"),
        (core, "NOT_HERE_POLL"),
        (core, "LOCAL_SAFETY"),
        (news, "FALLBACK"),
        (linger, "LINGER_POLL"),
    ):
        monkeypatch.setattr(module, name, 60.0)
    model = ScriptedModel(default=Slow("w " * 500, delay=0.02, forever=True))
    quick = Agent(name="q", model=ScriptedModel(default="ok"))
    path = tmp_path / "tether.db"
    a = Runtime(SQLiteStore(path), agents=[Agent(name="a", model=model), quick])
    b = Runtime(SQLiteStore(path), agents=[Agent(name="a", model=model), quick])
    async with a, b:
        a.scheduler.linger = b.scheduler.linger = 60.0
        key = SessionKey("local", "local", "rung")
        await a.sessions.create(key, "a")
        turn = await a.scheduler.submit(key, "a long one")
        await first_delta(a, key, turn.id)
        async with asyncio.timeout(10):
            done = await b.scheduler.cancel(key, turn.id)  # a runs it; b asks
        assert (done.status, done.reason) == ("cancelled", "cancelled")
        lease = a.scheduler.lease_of(key)
        assert lease is not None  # lingering on the session
        second = await b.scheduler.submit(key, "a quick one", agent=quick_ref(b))
        async with asyncio.timeout(10):
            ended = await b.scheduler.wait(key, second.id)
        assert (ended.status, ended.output) == ("completed", "ok")
        again = a.scheduler.lease_of(key)
        assert again is not None and again.token == lease.token  # a ran it, under its lease


def quick_ref(rt: Runtime) -> Any:
    return rt.served("q").ref


async def test_on_sqlite_a_cancel_asked_before_the_turn_is_registered_still_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process may ask to end a turn as soon as it is running in the store, before
    this process has registered it (between its start's commit and its first model call): the
    ring of that request is then heard with nothing of ours to end. The turn reads its cancel
    requests once as it registers, when a ring came meanwhile, so the request lands at once
    (it waited for the watcher's safety look a second later; every poll is a minute here)."""
    from tether.scheduler import core, news
    from tether.scheduler.sink import FencedSink

    for module, name in (
        (core, "CANCEL_POLL"),
        (core, "CANCEL_FALLBACK"),
        (core, "LOCAL_SAFETY"),
        (news, "FALLBACK"),
    ):
        monkeypatch.setattr(module, name, 60.0)
    model = ScriptedModel(default=Slow("w " * 500, delay=0.02, forever=True))
    path = tmp_path / "tether.db"
    mine = SQLiteStore(path)
    a = Runtime(mine, agents=[Agent(name="a", model=model)])
    b = Runtime(SQLiteStore(path), agents=[Agent(name="a", model=model)])
    start = FencedSink.start

    async def started_then_asked(self: FencedSink, user_input: str) -> Item:
        item = await start(self, user_input)
        if self.lease.owner == a.scheduler.owner:
            heard = mine.heard()
            assert heard is not None
            key, turn_id = self.lease.key, self._turn_id
            assert await b.store.request_cancel(key, turn_id, "cancelled", "caller_cancelled")
            async with asyncio.timeout(5):
                await mine.hear(heard)  # a has heard the ring: nothing of its own ran
        return item

    monkeypatch.setattr(FencedSink, "start", started_then_asked)
    async with a, b:
        a.scheduler.admission.starting = None  # the worker starts the turn (the next test: not)
        key = SessionKey("local", "local", "asked-early")
        await a.sessions.create(key, "a")
        turn = await a.scheduler.submit(key, "a long one")
        async with asyncio.timeout(10):
            done = await a.scheduler.wait(key, turn.id)
        assert (done.status, done.reason) == ("cancelled", "caller_cancelled")


async def test_a_cancel_asked_here_before_a_started_turn_registers_lands_at_once(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn started with its admission shows running in the store before its worker has
    registered it here: a cancel asked in this process meanwhile goes to the store (nothing to
    tell here yet) and is noted, and the turn honours it as it registers, rather than at the
    cancel watcher's safety look (a minute here)."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    from tether.scheduler import core, news

    for module, name in (
        (core, "CANCEL_POLL"),
        (core, "CANCEL_FALLBACK"),
        (core, "LOCAL_SAFETY"),
        (news, "FALLBACK"),
    ):
        monkeypatch.setattr(module, name, 60.0)
    model = ScriptedModel("warm", default=Slow("w " * 500, delay=0.02, forever=True))
    async with Runtime(store, agents=[Agent(name="a", model=model)]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "cancelled-early")
        await rt.sessions.create(key, "a")
        await rt.scheduler.wait(key, (await rt.scheduler.submit(key, "warm")).id)
        started = rt.scheduler.local.started
        wake = rt.scheduler.workers.wake

        def held(key: SessionKey) -> None:
            return None  # the worker is not woken until the cancel has been asked

        monkeypatch.setattr(rt.scheduler.workers, "wake", held)
        # The worker lingers (otherwise it takes the turn up by itself as it goes on).
        await wait_until(lambda: key in rt.scheduler.local.kicked)
        turn = await rt.scheduler.submit(key, "a long one")
        assert turn.status == "running" and key in started
        cancel = asyncio.ensure_future(rt.scheduler.cancel(key, turn.id))
        await wait_until(lambda: turn.id in rt.scheduler.local.asked)
        wake(key)
        async with asyncio.timeout(10):
            done = await cancel
        assert (done.status, done.reason) == ("cancelled", "cancelled")
        assert turn.id not in rt.scheduler.local.asked


async def test_a_turn_refused_for_want_of_a_session_leaves_no_principal_behind(
    store: Store,
) -> None:
    """The turn route reads no session before submitting: a caller sending turns to ids of
    no session must not leave an entry per id in this process."""
    async with Runtime(store, agents=[Agent(name="a", model=ScriptedModel(default="ok"))]) as rt:
        for n in range(20):
            key = SessionKey("acme", "mallory", f"none-{n}")
            with pytest.raises(SessionNotFound):
                await rt.scheduler.submit(key, "hi", principal=Principal("acme", "mallory"))
        assert not [k for k in rt.scheduler.local.principals if k.owner == "mallory"]


async def test_on_sqlite_a_cancel_from_elsewhere_before_a_started_turn_registers_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, asked by another process: its ring comes before the turn registers here,
    and the turn reads its requests as it registers because it counts rings from its
    admission (it ran in the store from then on), not from when its worker took it up."""
    from tether.scheduler import core, news

    for module, name in (
        (core, "CANCEL_POLL"),
        (core, "CANCEL_FALLBACK"),
        (core, "LOCAL_SAFETY"),
        (news, "FALLBACK"),
    ):
        monkeypatch.setattr(module, name, 60.0)
    model = ScriptedModel("warm", default=Slow("w " * 500, delay=0.02, forever=True))
    path = tmp_path / "tether.db"
    mine = SQLiteStore(path)
    a = Runtime(mine, agents=[Agent(name="a", model=model)])
    b = Runtime(SQLiteStore(path), agents=[Agent(name="a", model=model)])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "cancelled-elsewhere")
        await a.sessions.create(key, "a")
        await a.scheduler.wait(key, (await a.scheduler.submit(key, "warm")).id)
        wake = a.scheduler.workers.wake

        def held(key: SessionKey) -> None:
            return None  # the worker is not woken until the ring has been heard

        monkeypatch.setattr(a.scheduler.workers, "wake", held)
        await wait_until(lambda: key in a.scheduler.local.kicked)
        turn = await a.scheduler.submit(key, "a long one")
        assert turn.status == "running" and key in a.scheduler.local.started
        heard = mine.heard()
        assert heard is not None
        assert await b.store.request_cancel(key, turn.id, "cancelled", "caller_cancelled")
        async with asyncio.timeout(5):
            await mine.hear(heard)
        wake(key)
        async with asyncio.timeout(10):
            done = await a.scheduler.wait(key, turn.id)
        assert (done.status, done.reason) == ("cancelled", "caller_cancelled")


async def test_on_sqlite_a_cancel_from_elsewhere_before_a_leased_start_registers_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a turn started as its admission took the lease: the request and its ring
    come before the session's worker has even begun, and the turn still ends at once when it
    registers (every poll is a minute here)."""
    from tether.scheduler import core, news

    for module, name in (
        (core, "CANCEL_POLL"),
        (core, "CANCEL_FALLBACK"),
        (core, "LOCAL_SAFETY"),
        (news, "FALLBACK"),
    ):
        monkeypatch.setattr(module, name, 60.0)
    model = ScriptedModel(default=Slow("w " * 500, delay=0.02, forever=True))
    path = tmp_path / "tether.db"
    mine = SQLiteStore(path)
    a = Runtime(mine, agents=[Agent(name="a", model=model)])
    b = Runtime(SQLiteStore(path), agents=[Agent(name="a", model=model)])
    async with a, b:
        key = SessionKey("local", "local", "taken-then-cancelled")
        await a.sessions.create(key, "a")
        workers = a.scheduler.workers
        kick = workers.kick
        held: list[tuple[Any, ...]] = []
        monkeypatch.setattr(workers, "kick", lambda *args: held.append(args))
        turn = await a.scheduler.submit(key, "a long one")
        assert turn.status == "running" and held  # the worker is yet to be started
        heard = mine.heard()
        assert heard is not None
        assert await b.store.request_cancel(key, turn.id, "cancelled", "caller_cancelled")
        async with asyncio.timeout(5):
            await mine.hear(heard)
        monkeypatch.setattr(workers, "kick", kick)
        for args in held:
            kick(*args)
        async with asyncio.timeout(10):
            done = await a.scheduler.wait(key, turn.id)
        assert (done.status, done.reason) == ("cancelled", "caller_cancelled")


async def test_a_lease_taken_while_the_worker_waits_for_another_holder_is_used_at_once(
    store: Store,
) -> None:
    """This process's worker waits for a lease another owner holds (a turn of the session is
    queued); the owner lets it go, and the next turn's admission here takes it and starts the
    turn. The waiting worker runs that turn under the lease taken for it, at once: it does not
    wait on, unable to take a lease this process already holds, until the lease runs out and
    the turn ends owner_lost."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent], lease_ttl=30.0) as rt:
        key = SessionKey("local", "local", "taken-while-waiting")
        await rt.sessions.create(key, "a")
        other = await store.acquire_lease(key, new_owner_id("elsewhere"), 30.0)
        assert other is not None
        first = await rt.scheduler.submit(key, "one")
        assert first.status == "queued"  # the other owner holds the session
        await wait_until(lambda: key in rt.scheduler.local.workers)
        await asyncio.sleep(0.3)  # the worker here is waiting for the lease by now
        assert (await rt.scheduler.cancel(key, first.id)).status == "cancelled"
        await store.release_lease(other)
        second = await rt.scheduler.submit(key, "two")
        async with asyncio.timeout(5):  # well inside the lease's 30 s
            done = await rt.scheduler.wait(key, second.id)
        assert (done.status, done.output) == ("completed", "ok")


async def test_close_waits_for_a_turn_started_by_an_admission_in_flight(store: Store) -> None:
    """close() begins while an admission that takes the session's lease and starts the turn
    is being written: the worker that gets them as the write settles runs the turn to its end
    before close() returns, rather than being left behind with the turn shown running."""
    if not isinstance(store, StartingQueue):
        pytest.skip("this store starts turns by start_turn only")
    agent = Agent(name="a", model=ScriptedModel(default="ran"))
    async with Runtime(store, agents=[agent]) as rt:
        key = SessionKey("local", "local", "closed-mid-admission")
        await rt.sessions.create(key, "a")
        taking = store.enqueue_turn_taken
        entered, go = asyncio.Event(), asyncio.Event()

        async def slow(*args: Any, **kwargs: Any) -> Any:
            entered.set()
            await go.wait()
            return await taking(*args, **kwargs)

        store.enqueue_turn_taken = slow  # type: ignore[method-assign]
        submitted = asyncio.create_task(rt.scheduler.submit(key, "as it closes"))
        await entered.wait()
        closing = asyncio.create_task(rt.scheduler.close(drain_timeout=10.0))
        await wait_until(lambda: rt.scheduler.closing)
        go.set()
        turn = await submitted
        async with asyncio.timeout(15):
            await closing
        stored = await store.get_turn(key, turn.id)
        assert stored is not None and (stored.status, stored.output) == ("completed", "ran")


async def test_close_does_not_wait_on_a_worker_waiting_for_another_holders_lease(
    store: Store,
) -> None:
    """A turn queued here behind a lease another live process holds: that process runs it.
    close() does not wait for the worker here to give up waiting (it stops at once), let alone
    until the drain timeout, and the turn stays queued for the holder."""
    agent = Agent(name="a", model=ScriptedModel(default="ok"))
    async with Runtime(store, agents=[agent]) as rt:
        key = SessionKey("local", "local", "held-elsewhere-at-close")
        await rt.sessions.create(key, "a")
        other = await store.acquire_lease(key, new_owner_id("elsewhere"), 60.0)
        assert other is not None
        turn = await rt.scheduler.submit(key, "for the holder")
        await wait_until(lambda: key in rt.scheduler.local.workers)
        worker = rt.scheduler.local.workers[key]
        async with asyncio.timeout(10):  # the drain timeout is a minute
            await rt.scheduler.close(drain_timeout=60.0)
        assert worker.done() and not worker.cancelled()
        stored = await store.get_turn(key, turn.id)
        assert stored is not None and stored.status == "queued"


async def test_live_events_run_at_most_live_ahead_past_the_store() -> None:
    """A turn's events are published at once and stored a moment later; while the store does
    not keep up, no more than LIVE_AHEAD of them are shown unstored (the ending a successor
    writes after a crash skips that many seqs), and those held back follow, in order, once a
    write catches up."""
    from tether.records import Item, Lease
    from tether.scheduler.feeds import TurnFeed
    from tether.scheduler.sink import FencedSink
    from tether.store.rules import LIVE_AHEAD

    class SlowStore:
        def __init__(self, last: int) -> None:
            self.gate = asyncio.Event()
            self.stored: list[int] = []
            self.last = last
            self.all_stored = asyncio.Event()

        async def append(self, lease: Lease, turn_id: str, items: Any, events: Any) -> list[Item]:
            await self.gate.wait()
            self.stored += [e.seq for e in events]
            if self.stored[-1] == self.last:
                self.all_stored.set()
            return []

    last = 2 + LIVE_AHEAD + 50
    store = SlowStore(last)
    feed = TurnFeed("t")
    lease = Lease(SessionKey("local", "local", "s"), "me", 1, time.time() + 30)
    sink = FencedSink(store, lease, "t", feed, flush_interval=0.01)  # type: ignore[arg-type]
    user = Item(2, "t", "user", "hi", True, None, None, None, {}, time.time())
    sink.started_with_admission(user)  # seqs 1-2 stored with the admission
    for n in range(LIVE_AHEAD + 50):
        sink.emit("message.delta", {"text": f"w{n}"})
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # the flush is under way, and stuck
    published = [e.seq for e in feed._events]
    assert published[-1] == 2 + LIVE_AHEAD  # nothing stored past 2: LIVE_AHEAD ahead at most
    store.gate.set()
    async with asyncio.timeout(5):
        await store.all_stored.wait()
    assert [e.seq for e in feed._events] == list(range(2, last + 1))
    assert store.stored == list(range(3, last + 1))


@pytest.mark.parametrize("refused", [False, True])
async def test_an_ending_is_published_once_the_store_has_it(refused: bool) -> None:
    """``turn.ended`` reaches followers only once the ending is stored, after every event
    before it: a follower that hears it and then reads the turn (from another connection, on
    PostgreSQL) finds the turn ended, not running. An ending the store refuses (the lease was
    lost meanwhile) is never published: the turn's ending is whoever recovered it's."""
    from types import SimpleNamespace

    from tether.errors import StaleLease
    from tether.records import Item, Lease, TurnEnding
    from tether.scheduler.feeds import TurnFeed
    from tether.scheduler.sink import FencedSink
    from tether.store.rules import terminal_event_data

    class GatedStore:
        def __init__(self) -> None:
            self.gate = asyncio.Event()
            self.writing = asyncio.Event()

        async def end_turn(self, *args: Any, **kwargs: Any) -> Any:
            self.writing.set()
            await self.gate.wait()
            if refused:
                raise StaleLease("another process holds the session now")
            return SimpleNamespace(status="completed")

    store = GatedStore()
    feed = TurnFeed("t")
    lease = Lease(SessionKey("local", "local", "s"), "me", 1, time.time() + 30)
    sink = FencedSink(store, lease, "t", feed)  # type: ignore[arg-type]
    sink.started_with_admission(Item(2, "t", "user", "hi", True, None, None, None, {}, time.time()))
    sink.emit("message.delta", {"text": "hello"})
    ending = TurnEnding("completed", "answered", output="hello", complete=True)
    ended = asyncio.create_task(sink.end(ending, [], terminal_event_data("t", ending)))
    async with asyncio.timeout(5):
        await store.writing.wait()
    await asyncio.sleep(0.01)
    # The delta went out live; the ending waits for its write.
    assert [e.type for e in feed._events] == ["turn.started", "message.delta"]
    store.gate.set()
    if refused:
        with pytest.raises(StaleLease):
            await ended
        assert [e.type for e in feed._events] == ["turn.started", "message.delta"]
    else:
        await ended
        assert [(e.seq, e.type) for e in feed._events] == [
            (2, "turn.started"),
            (3, "message.delta"),
            (4, "turn.ended"),
        ]
