"""What the same work costs when it runs right after a sleep: the host's share of a quiet turn.

Reproduce (from the repository root)::

    .venv/bin/python bench/wake.py             # ~30 s
    .venv/bin/python bench/wake.py --runs 50   # quicker

One session at a time, a tether turn is a few bursts of work with the process asleep in
between (the model's 50 ms, the client's next request), and on this 2-core virtual machine
each burst costs more CPU than the same burst run back to back. This measures that apart from
tether: two fixed pieces of work, timed with ``time.thread_time_ns`` (CPU of this thread only),
after pauses of 0 to 200 ms spent asleep:

* ``python``: dict and str work in pure Python, ~0.25 ms (the interpreter's own cost);
* ``sqlite``: one write transaction on a WAL file (``BEGIN IMMEDIATE``, an insert, ``COMMIT``),
  as the store's thread runs for a turn's admission or ending.

Each row gives the median CPU per piece and its ratio to the back-to-back row of the same
run. A ratio well above 1 is the host (caches and the virtual CPU woken cold), not the code:
it is why one session's CPU per turn (``hot_path.py``) is two to three times the CPU of a turn
at 64 sessions, where the process never sleeps, for the reference server as for tether.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

PAUSES_MS = (0.0, 1.0, 5.0, 50.0, 200.0)


def python_work() -> int:
    counts: dict[int, int] = {}
    words = []
    for i in range(2_000):
        counts[i % 97] = counts.get(i % 97, 0) + i
        if i % 50 == 0:
            words.append(f"word-{i}")
    return len(" ".join(words)) + len(counts)


def sqlite_work(conn: sqlite3.Connection) -> Callable[[], int]:
    n = [0]

    def work() -> int:
        n[0] += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (n, body) VALUES (?, ?)", (n[0], "x" * 400))
        conn.execute("COMMIT")
        return n[0]

    return work


def median_cpu_us(work: Callable[[], int], pause_ms: float, runs: int) -> float:
    for _ in range(5):  # warm-up
        work()
    spent: list[int] = []
    for _ in range(runs):
        if pause_ms:
            time.sleep(pause_ms / 1000)
        start = time.thread_time_ns()
        work()
        spent.append(time.thread_time_ns() - start)
    return statistics.median(spent) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100, help="pieces of work per row")
    args = parser.parse_args()
    console = Console(highlight=False)
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(Path(tmp) / "wake.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE t (n INTEGER PRIMARY KEY, body TEXT)")
        works = {"python": python_work, "sqlite": sqlite_work(conn)}
        table = Table(title="CPU of one piece of work after a pause asleep (median)")
        table.add_column("pause", justify="right")
        for name in works:
            table.add_column(f"{name} us", justify="right")
            table.add_column("x back to back", justify="right")
        base: dict[str, float] = {}
        for pause in PAUSES_MS:
            cells = [f"{pause:g} ms"]
            for name, work in works.items():
                us = median_cpu_us(work, pause, args.runs)
                base.setdefault(name, us)
                cells += [f"{us:.0f}", f"{us / base[name]:.2f}"]
            table.add_row(*cells)
        conn.close()
    console.print(table)
    console.print(
        "CPU of this thread (time.thread_time_ns) per piece, after the pause in time.sleep. "
        "The first row runs the pieces back to back."
    )


if __name__ == "__main__":
    main()
