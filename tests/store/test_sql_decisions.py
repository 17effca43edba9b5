"""What the SQL backends keep of decisions beyond what the conformance suite can see: no
decision row outlives its session (forget, the TTL sweep), no held memory outlives its turn,
the deadline sweep on several PostgreSQL nodes at once ends each decision once, and SQLite's
statements about active turns and due decisions keep to their indexes."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from tether.events import DECISION_MADE, DECISION_REQUESTED
from tether.records import MemoryWrites, Namespace, NewDecision, SessionKey, Usage
from tether.store import PostgresStore, SQLiteStore, rules
from tether.store.protocol import Store
from tether.store.sqlite import queries as sq
from tether.store.sqlite.migrations import migrate
from tether.testing.conformance._support import (
    acquire,
    call,
    ev,
    key,
    new_session,
    note,
    result,
    running_turn,
    vec,
)

Count = Callable[[str], Awaitable[int]]
"""The rows of ``"<table> [WHERE …]"``, read beside the store through a connection of its own."""


@pytest.fixture(params=["sqlite", "postgres"])
async def sql(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Store, Count]]:
    store: Store
    count: Count
    if request.param == "sqlite":
        path = tmp_path / "t.db"
        store = SQLiteStore(path)

        async def count(rows: str) -> int:
            def read() -> int:
                conn = sqlite3.connect(path)
                try:
                    return int(conn.execute(f"SELECT count(*) FROM {rows}").fetchone()[0])
                finally:
                    conn.close()

            return await asyncio.to_thread(read)

    else:
        url: str = request.getfixturevalue("postgres_url")
        store = PostgresStore(url)

        async def count(rows: str) -> int:
            conn = await asyncpg.connect(url)
            try:
                return int(await conn.fetchval(f"SELECT count(*) FROM {rows}"))
            finally:
                await conn.close()

    await store.open()
    try:
        yield store, count
    finally:
        await store.close()


async def park(store: Store, k: SessionKey, turn_id: str = "t1", wait: float = 600.0) -> None:
    lease = await running_turn(store, k, turn_id)
    record = note(Namespace.session(k), f"n-{k.owner}-{turn_id}", "likes tea")
    d = rules.new_decision(
        k, turn_id, NewDecision("c2", "approval", {"tool": "lookup"}, wait), time.time()
    )
    await store.park_turn(
        lease,
        turn_id,
        [call("c1"), call("c2"), result("c1")],
        [ev(3, DECISION_REQUESTED)],
        d,
        usage=Usage(),
        memory=MemoryWrites(((record, vec(1.0, 0.0)),), ()),
    )
    await store.release_lease(lease)


async def test_forget_and_the_ttl_sweep_leave_no_decision_rows(
    sql: tuple[Store, Count],
) -> None:
    store, count = sql
    alice, bob = key("s1"), key("s1", owner="bob")
    for k in (alice, bob):
        await new_session(store, k)
        await park(store, k, f"t-{k.owner}")
    assert await count("decisions") == 2
    await store.forget_user("acme", "alice")
    assert await count("decisions") == 1
    assert await store.list_decisions(bob) != []

    # A parked turn is active: the sweep leaves its session alone, however expired.
    await store.update_session(bob, ttl_seconds=0.0)
    assert await store.sweep_expired(time.time() + 1) == []
    await store.end_waiting_turn(bob, "t-bob", "session_expired")
    assert len(await store.sweep_expired(time.time() + 1)) == 1
    assert await count("decisions") == 0


async def test_a_turn_lets_go_of_its_held_memory_when_it_goes_on_or_ends(
    sql: tuple[Store, Count],
) -> None:
    store, count = sql
    k = await new_session(store)
    await park(store, k, "t1")
    assert await count("turns WHERE held_memory IS NOT NULL") == 1
    await store.decide(k, "t1", "c2", "approve", by="alice")
    lease = await acquire(store, k, "node-b")
    _, held = await store.resume_turn(lease, "t1", [ev(5)])
    assert held is not None
    assert await count("turns WHERE held_memory IS NOT NULL") == 0
    await store.release_lease(lease)

    other = await new_session(store, key("s2"))
    await park(store, other, "t9")
    await store.end_waiting_turn(other, "t9", "cancelled")
    assert await count("turns WHERE held_memory IS NOT NULL") == 0


async def test_sweeping_nodes_end_each_decision_once(postgres_url: str) -> None:
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    await a.open()
    await b.open()
    try:
        keys = [key(f"s{n}") for n in range(12)]
        for k in keys:
            await new_session(a, k)
            await park(a, k, f"t-{k.session_id}", wait=0.01)
        await asyncio.sleep(0.05)
        now = time.time()
        swept = await asyncio.gather(*(s.expire_decisions(now, 5) for s in (a, b, a, b, a, b)))
        # Nodes that found the rest held by another sweep end the remainder next time.
        while rest := await a.expire_decisions(time.time()):
            swept.append(rest)
        ended = [k for batch in swept for k in batch]
        assert sorted(ended, key=str) == sorted(keys, key=str)
        for k in keys:
            events = await a.list_events(k, f"t-{k.session_id}")
            assert [e.type for e in events].count(DECISION_MADE) == 1
    finally:
        await a.close()
        await b.close()


def test_sqlite_statements_about_active_turns_and_due_decisions_use_their_indexes() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    migrate(conn)

    def plan(sql: str) -> str:
        args = (None,) * sql.count("?")
        return " | ".join(r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))

    for statement in (sq.ACTIVE_TURNS, sq.ACTIVE_TURN_IDS, sq.FIRST_ACTIVE_TURN):
        assert "turns_active" in plan(statement), statement
    # The owner's turns under way: its own entries of the index by owner, not every owner's.
    assert "turns_owner_busy (tenant=? AND owner=?)" in plan(sq.OWNER_ACTIVE)
    # The periodic sweeps read what they look for, not every session: the orphan sweep starts
    # from the active turns, the expiry sweep from the expiring sessions.
    orphans = plan(sq.SESSIONS_NEEDING_WORK)
    assert orphans.startswith("SCAN t USING INDEX turns_active"), orphans
    assert "SCAN s" not in orphans
    assert "sessions_expiring (expires_at" in plan(sq.SWEEP_EXPIRED)
    assert "SCAN s" not in plan(sq.SWEEP_EXPIRED)
    assert "decisions_pending" in plan(sq.DUE_DECISIONS)
    assert "decisions_pending" in plan(sq.NEXT_DECISION_DEADLINE)
