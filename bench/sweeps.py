"""What the periodic sweeps cost a big SQLite file: orphaned work (every lease TTL / 2, 15 s by
default) and expired sessions (every minute). Both run on the store's one thread, so every
other store call (every turn) waits while they do.

Reproduce (from the repository root)::

    .venv/bin/python bench/sweeps.py                      # 100,000 sessions
    .venv/bin/python bench/sweeps.py --sessions 1000000

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

from tether.store import SQLiteStore

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


async def timed(call: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(CALLS):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = SQLiteStore(path)
        await store.open()
        await store.close()
        fill(path, args.sessions)
        store = SQLiteStore(path)
        await store.open()
        try:
            orphans = await timed(lambda: store.sessions_needing_work(unowned_at=time.time()))
            expired = await timed(lambda: store.sweep_expired(time.time()))
        finally:
            await store.close()
    print(
        f"{args.sessions:,} sessions, {ACTIVE:,} with a queued turn, {PARKED} waiting for a"
        f" decision; median of {CALLS} calls:"
    )
    print(f"  sessions_needing_work (orphan sweep):  {orphans:8.2f} ms")
    print(f"  sweep_expired (nothing expired):       {expired:8.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
