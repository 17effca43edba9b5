"""What a SQLite store call costs in CPU for the hop to the store's thread and back.

Reproduce (from the repository root)::

    .venv/bin/python bench/store_hop.py                # 2,000 calls a row, ~50 s
    .venv/bin/python bench/store_hop.py --calls 20000

Every call of :class:`~tether.store.SQLiteStore` runs on the store's one thread (sqlite3 blocks,
so never on the event loop): the event loop queues it and wakes the thread, the thread runs it
and hands the result back with ``call_soon_threadsafe``, which wakes the loop. Under load the
thread is busy and calls ride along in batches (group commit); with one session at a time it
sleeps between calls, and each call wakes it from sleep. The rows, CPU of the whole process a
call (``getrusage``, both threads; the cost of the pauses between calls measured alone and
taken off):

* ``store.get_session``, one call at a time with a 0.5 ms pause between calls (the thread
  asleep when each call comes: one session's turn);
* the same, 8 calls at once (the thread woken once for the 8);
* the same ``SELECT`` on a connection of this thread (what the call costs without the hop).

What it says: the hop of a call to a sleeping thread, next to the query itself, is the part of
a turn's store calls that grows when a server is nearly idle (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sqlite3
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from tether.records import SessionKey
from tether.store import SQLiteStore

PAUSE = 0.0005
REPEATS = 5
KEY = SessionKey("acme", "alice", "s")
SELECT = "SELECT * FROM sessions WHERE tenant = ? AND owner = ? AND session_id = ?"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def per_call(
    rounds: int, calls_a_round: int, do: Callable[[], Awaitable[object]], pauses: float
) -> float:
    """CPU microseconds a call: ``rounds`` rounds of ``do()`` then a pause, the pauses' own
    CPU (``pauses`` seconds a round, measured alone) taken off."""
    start = cpu()
    for _ in range(rounds):
        await do()
        await asyncio.sleep(PAUSE)
    spent = cpu() - start
    return (spent - pauses * rounds) / (rounds * calls_a_round) * 1e6


async def main(calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-hop-") as tmp:
        path = Path(tmp) / "tether.db"
        store = SQLiteStore(path)
        await store.open()
        inline = sqlite3.connect(path, isolation_level=None)
        try:
            await store.create_session(KEY, "assistant")
            for _ in range(200):  # warm: the statement cache, the thread, the pages
                await store.get_session(KEY)

            async def pause_only() -> None:
                return None

            async def one() -> object:
                return await store.get_session(KEY)

            async def eight() -> object:
                return await asyncio.gather(*(store.get_session(KEY) for _ in range(8)))

            async def here() -> object:
                return inline.execute(SELECT, (KEY.tenant, KEY.owner, KEY.session_id)).fetchone()

            rows = [
                ("store.get_session, one at a time (the thread asleep)", calls, 1, one),
                ("store.get_session, 8 at once", calls // 8, 8, eight),
                ("the same SELECT on this thread's own connection", calls, 1, here),
            ]
            # The rows take turns, five times over, each after a fresh measure of the pauses
            # alone (this host's speed drifts); the median of each row is printed.
            got: list[list[float]] = [[] for _ in rows]
            for _ in range(REPEATS):
                for n, (_, rounds, each, do) in enumerate(rows):
                    pauses = await per_call(rounds, 1, pause_only, 0.0) / 1e6
                    got[n].append(await per_call(rounds, each, do, pauses))
            print(f"CPU a call, {calls:,} calls a row (SQLite {sqlite3.sqlite_version}), median of")
            print(f"{REPEATS} runs:")
            for (label, *_), us in zip(rows, got, strict=True):
                print(f"  {label:<56} {statistics.median(us):7.1f} us")
        finally:
            inline.close()
            await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    asyncio.run(main(parser.parse_args().calls))
