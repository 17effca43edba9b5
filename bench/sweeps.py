"""What the periodic sweeps cost a big SQLite file: orphaned work (every lease TTL / 2, 15 s by
default) and expired sessions (every minute). Both run on the store's one thread, so every
other store call (every turn) waits while they do.

Reproduce (from the repository root)::

    .venv/bin/python bench/sweeps.py                      # 100,000 sessions
    .venv/bin/python bench/sweeps.py --sessions 1000000
    .venv/bin/python bench/sweeps.py --store postgresql://postgres@127.0.0.1:5432/bench

With ``--store``, a PostgreSQL database that this script creates (dropped first if it exists) and
drops at the end; there the sweeps run on the database's side, not on the store's thread.

The file is filled with plain SQL after the store has migrated it (making 100,000 sessions
through the store would take minutes): ``--sessions`` sessions with a TTL a month away, two
ended turns each, 1,000 of them with a queued turn and 300 with a turn waiting for a decision.
Printed: the median wall milliseconds of ``sessions_needing_work`` and ``sweep_expired`` (which
finds nothing to sweep: it still has to look) over five calls each.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

from tether.store import PostgresStore, SQLiteStore
from tether.store.protocol import Store

ACTIVE = 1000
PARKED = 300
CALLS = 5


def fill(path: Path, sessions: int) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        month = time.time() + 30 * 86400
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO sessions (pk, tenant, owner, session_id, agent, created_at,"
            " updated_at, expires_at) VALUES (?, 'bench', ?, ?, 'a', 0, 0, ?)",
            ((pk, f"user-{pk % 5000}", f"s{pk}", month) for pk in range(1, sessions + 1)),
        )
        # As any release inserts turns (a newer one fills in the columns it added itself).
        insert = (
            "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at)"
            " VALUES (?, ?, ?, 'x', 'enqueue', ?, 0)"
        )
        conn.executemany(
            insert,
            ((f"ended-{pk}-{n}", pk, n, "done") for pk in range(1, sessions + 1) for n in (1, 2)),
        )
        conn.executemany(
            insert, ((f"queued-{i}", i * 97 % sessions + 1, 3, "queued") for i in range(ACTIVE))
        )
        conn.executemany(
            insert,
            ((f"parked-{i}", i * 89 % sessions + 1, 4, "awaiting_input") for i in range(PARKED)),
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def fill_postgres(url: str, sessions: int) -> None:
    """The same rows as :func:`fill`, made by PostgreSQL itself."""
    conn = await asyncpg.connect(url)
    try:
        month = time.time() + 30 * 86400
        await conn.execute(
            "INSERT INTO sessions (pk, tenant, owner, session_id, agent, created_at, updated_at,"
            " expires_at) OVERRIDING SYSTEM VALUE"
            " SELECT i, 'bench', 'user-' || (i % 5000), 's' || i, 'a', 0, 0, $1"
            " FROM generate_series(1, $2::bigint) i",
            month,
            sessions,
        )
        await conn.execute("SELECT setval(pg_get_serial_sequence('sessions', 'pk'), $1)", sessions)
        insert = (
            "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at)"
            " SELECT {id}, {pk}, {seq}, 'x', 'enqueue', '{status}', 0 FROM generate_series({n}) i"
        )
        for n in (1, 2):
            await conn.execute(
                insert.format(
                    id=f"'ended-' || i || '-{n}'", pk="i", seq=n, status="done", n=f"1, {sessions}"
                )
            )
        for prefix, step, seq, status, count in (
            ("queued", 97, 3, "queued", ACTIVE),
            ("parked", 89, 4, "awaiting_input", PARKED),
        ):
            await conn.execute(
                insert.format(
                    id=f"'{prefix}-' || i",
                    pk=f"(i * {step} % {sessions}) + 1",
                    seq=seq,
                    status=status,
                    n=f"0, {count - 1}",
                )
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def measure(store: Store) -> tuple[float, float]:
    await store.open()
    try:
        orphans = await timed(lambda: store.sessions_needing_work(unowned_at=time.time()))
        expired = await timed(lambda: store.sweep_expired(time.time()))
    finally:
        await store.close()
    return orphans, expired


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--store", help="a postgresql:// URL (default: a SQLite file)")
    args = parser.parse_args()
    if args.store:
        base, _, name = args.store.rpartition("/")
        admin = await asyncpg.connect(f"{base}/postgres")
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await admin.execute(f'CREATE DATABASE "{name}"')
            migrated = PostgresStore(args.store)
            await migrated.open()
            await migrated.close()
            await fill_postgres(args.store, args.sessions)
            orphans, expired = await measure(PostgresStore(args.store))
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await admin.close()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.db"
            migrated_file = SQLiteStore(path)
            await migrated_file.open()
            await migrated_file.close()
            fill(path, args.sessions)
            orphans, expired = await measure(SQLiteStore(path))
    print(
        f"{'PostgreSQL' if args.store else 'SQLite'}, {args.sessions:,} sessions, {ACTIVE:,} with"
        f" a queued turn, {PARKED} waiting for a decision; median of {CALLS} calls:"
    )
    print(f"  sessions_needing_work (orphan sweep):  {orphans:8.2f} ms")
    print(f"  sweep_expired (nothing expired):       {expired:8.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
