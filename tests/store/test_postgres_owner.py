"""PostgreSQL's admissions of one owner's turns under the owner's bounds (migration 23): those
that cannot take the owner past a bound pass each other; every one that counts waits for them.
These tests skip without ``TETHER_TEST_POSTGRES_URL`` (see tests/conformance/postgres_db.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg  # type: ignore[import-untyped]

from tether.errors import LimitExceeded
from tether.records import NewEvent, NewItem, PrincipalLimits, SessionKey
from tether.store import PostgresStore

OWNER_LOCK = "hashtextextended($1 || chr(31) || $2, 7)"


@asynccontextmanager
async def opened(*stores: PostgresStore) -> AsyncIterator[None]:
    try:
        await asyncio.gather(*(s.open() for s in stores))
        yield
    finally:
        for s in stores:
            await s.close()


@asynccontextmanager
async def owner_lock_held(
    url: str, tenant: str, owner: str, *, shared: bool
) -> AsyncIterator[asyncpg.Connection]:
    """Another connection holding the owner's lock in an open transaction until the block ends
    (then it commits): shared, it stands for an admission of the kind that takes it shared and
    has not committed yet."""
    conn = await asyncpg.connect(url)
    tx = conn.transaction()
    await tx.start()
    try:
        how = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        await conn.execute(f"SELECT {how}({OWNER_LOCK})", tenant, owner)
        yield conn
    finally:
        await tx.commit()
        await conn.close()


async def admit(
    store: PostgresStore,
    start: asyncio.Event,
    key: SessionKey,
    turn_id: str,
    limits: PrincipalLimits,
    *,
    make: bool,
    after: float,
) -> bool:
    """Once ``start`` is set and ``after`` seconds more: make the session (``make``, without a
    bound on sessions, so without the owner's lock), then admit a turn on it; whether it was
    admitted."""
    await start.wait()
    await asyncio.sleep(after)
    if make:
        await store.create_session(key, "assistant")
    try:
        await store.enqueue_turn(key, turn_id=turn_id, input="x", policy="enqueue", limits=limits)
    except LimitExceeded:
        return False
    return True


async def test_turns_on_idle_sessions_of_an_owner_within_its_bound_do_not_wait_for_each_other(
    postgres_url: str,
) -> None:
    # Alice holds 3 sessions with room for 5 busy ones: no admission can take her past it, so
    # one in flight (the shared lock held) holds none of these up. Before migration 23 each
    # waited for the one before it to commit, WAL flush included.
    store = PostgresStore(postgres_url)
    keys = [SessionKey("acme", "alice", f"idle{n}") for n in range(3)]
    room = PrincipalLimits(running_turns=5, queued_turns=10)
    async with opened(store):
        for k in keys:
            await store.create_session(k, "assistant")
        async with owner_lock_held(postgres_url, "acme", "alice", shared=True):
            queued = await asyncio.wait_for(
                store.enqueue_turn(keys[0], turn_id="a", input="x", policy="enqueue", limits=room),
                5,
            )
            assert queued.status == "queued"
            taken, lease, _ = await asyncio.wait_for(
                store.enqueue_turn_taken(
                    keys[1],
                    owner="node-a",
                    ttl=30,
                    turn_id="b",
                    input="x",
                    policy="enqueue",
                    items=[NewItem("user", "x")],
                    events=[NewEvent(2, "turn.started", {"turn_id": "b"})],
                    limits=room,
                ),
                5,
            )
            assert taken.status == "running" and lease is not None
            # Each of these counts, so each waits for the admission in flight to commit: a
            # turn behind a busy session (the queued bound), a turn of an owner holding more
            # sessions than the bound on busy ones, a session made under the owner's bound.
            counting = [
                store.enqueue_turn(keys[0], turn_id="c", input="x", policy="enqueue", limits=room),
                store.enqueue_turn(
                    keys[2],
                    turn_id="d",
                    input="x",
                    policy="enqueue",
                    limits=PrincipalLimits(running_turns=2),
                ),
                store.create_session(
                    SessionKey("acme", "alice", "more"), "assistant", max_sessions=10
                ),
            ]
            waiting = [asyncio.ensure_future(c) for c in counting]
            await asyncio.sleep(0.5)
            assert not any(w.done() for w in waiting)
        done = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 5)
    # Two of the two busy sessions the last bound allows are taken: the turn on a third is
    # refused, by the count it waited for.
    assert [type(d).__name__ for d in done] == ["Turn", "LimitExceeded", "tuple"]


async def test_the_owners_room_takes_its_lock_shared_only_where_it_need_not_count(
    postgres_url: str,
) -> None:
    # tether_owner_room in a transaction of its own, and the owner's lock as another
    # connection finds it while that transaction is open.
    store = PostgresStore(postgres_url)
    async with opened(store):
        for n in range(3):
            await store.create_session(SessionKey("acme", "alice", f"r{n}"), "assistant")
    asker, other = await asyncpg.connect(postgres_url), await asyncpg.connect(postgres_url)
    try:
        pid = await asker.fetchval("SELECT pg_backend_pid()")

        async def held(active: bool, running: int | None) -> tuple[object, list[str]]:
            tx = asker.transaction()
            await tx.start()
            try:
                row = await asker.fetchrow(
                    "SELECT refused, busy FROM tether_owner_room('acme', 'alice', $1, $2, 4)",
                    active,
                    running,
                )
                assert row is not None and row["refused"] is False
                modes = await other.fetch(
                    "SELECT mode FROM pg_locks WHERE locktype = 'advisory' AND pid = $1"
                    " ORDER BY mode",
                    pid,
                )
                return row["busy"], [m["mode"] for m in modes]
            finally:
                await tx.rollback()

        # An idle session, 3 sessions, room for 3: no count, the lock shared.
        assert await held(False, 3) == (None, ["ShareLock"])
        # Room for 2 only: counted, under the lock alone (the shared one was given back).
        assert await held(False, 2) == (0, ["ExclusiveLock"])
        # No bound on busy sessions: a turn on an idle session takes no lock.
        assert await held(False, None) == (None, [])
        # Behind a busy session the queued bound counts, under the lock alone.
        assert await held(True, 3) == (0, ["ExclusiveLock"])
    finally:
        await asker.close()
        await other.close()


async def test_racing_admissions_and_creations_of_one_owner_never_pass_its_bound(
    postgres_url: str,
) -> None:
    # Each round, an owner with as many sessions as busy ones allowed (so its first admissions
    # go shared) makes more sessions without a bound while turns are admitted on all of them
    # from two pools at once: never more busy sessions than the bound, and exactly that many
    # (a refusal is counted, so it comes only once the bound is reached).
    a, b = (PostgresStore(postgres_url, min_size=8, max_size=8) for _ in range(2))
    bound = 3
    limits = PrincipalLimits(running_turns=bound)
    rng = random.Random(23)
    async with opened(a, b):
        for round_ in range(12):
            owner = f"racer{round_}"
            first = [SessionKey("acme", owner, f"s{n}") for n in range(bound)]
            later = [SessionKey("acme", owner, f"t{n}") for n in range(bound + 3)]
            for k in first:
                await a.create_session(k, "assistant")
            start = asyncio.Event()
            tasks = [
                asyncio.create_task(
                    admit(
                        a if n % 2 else b,
                        start,
                        k,
                        f"{owner}-{n}",
                        limits,
                        make=n >= bound,
                        after=rng.random() * 0.01,
                    )
                )
                for n, k in enumerate([*first, *later])
            ]
            await asyncio.sleep(0.02)
            start.set()
            admitted = sum(await asyncio.gather(*tasks))
            busy = [k for k in [*first, *later] if await a.active_turns(k)]
            assert admitted == len(busy) == bound, (round_, admitted, len(busy))
