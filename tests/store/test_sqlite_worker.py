"""Group commit: calls batched into one transaction still succeed or fail one by one."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from tether.store.sqlite.worker import SQLiteWorker


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY)")
    return conn


async def test_a_failing_call_rolls_back_alone(tmp_path: Path) -> None:
    worker = SQLiteWorker(lambda: _connect(tmp_path / "w.db"))
    await worker.start()

    def insert(n: int, fail: bool) -> Callable[[sqlite3.Connection], int]:
        def do(c: sqlite3.Connection) -> int:
            c.execute("INSERT INTO t (n) VALUES (?)", (n,))
            c.execute("INSERT INTO t (n) VALUES (?)", (n + 10_000,))
            if fail:
                raise ValueError(f"call {n} fails after writing")
            return n

        return do

    calls = [worker.call(insert(n, n % 3 == 0), write=True) for n in range(300)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    for n, r in enumerate(results):
        if n % 3 == 0:
            assert isinstance(r, ValueError)
        else:
            assert r == n
    rows = await worker.call(
        lambda c: [r[0] for r in c.execute("SELECT n FROM t ORDER BY n")], write=False
    )
    kept = [n for n in range(300) if n % 3]
    assert rows == kept + [n + 10_000 for n in kept]
    await worker.stop()
    # Committed for real: another connection sees it.
    other = sqlite3.connect(tmp_path / "w.db")
    assert other.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 2 * len(kept)
    other.close()


async def test_a_failing_call_alone_in_its_batch_leaves_nothing(tmp_path: Path) -> None:
    # Calls one at a time: each is a batch of its own, written without a savepoint.
    statements: list[str] = []

    def connect() -> sqlite3.Connection:
        conn = _connect(tmp_path / "a.db")
        conn.set_trace_callback(statements.append)
        return conn

    worker = SQLiteWorker(connect)
    await worker.start()

    def insert(n: int, fail: bool) -> Callable[[sqlite3.Connection], int]:
        def do(c: sqlite3.Connection) -> int:
            c.execute("INSERT INTO t (n) VALUES (?)", (n,))
            if fail:
                raise ValueError(f"call {n} fails after writing")
            return n

        return do

    assert await worker.call(insert(1, False), write=True) == 1
    with pytest.raises(ValueError):
        await worker.call(insert(2, True), write=True)
    assert await worker.call(insert(3, False), write=True) == 3
    rows = await worker.call(
        lambda c: [r[0] for r in c.execute("SELECT n FROM t ORDER BY n")], write=False
    )
    assert rows == [1, 3]
    await worker.stop()
    assert not [s for s in statements if s.startswith("SAVEPOINT")]
    assert statements.count("ROLLBACK") == 1


async def test_reads_see_writes_queued_before_them(tmp_path: Path) -> None:
    worker = SQLiteWorker(lambda: _connect(tmp_path / "r.db"))
    await worker.start()
    write = worker.call(lambda c: c.execute("INSERT INTO t (n) VALUES (1)").rowcount, write=True)
    read = worker.call(lambda c: c.execute("SELECT COUNT(*) FROM t").fetchone()[0], write=False)
    assert list(await asyncio.gather(write, read)) == [1, 1]
    await worker.stop()
    with pytest.raises(sqlite3.ProgrammingError):
        await worker.call(lambda c: None, write=False)


async def test_open_failure_is_reported(tmp_path: Path) -> None:
    def broken() -> sqlite3.Connection:
        raise sqlite3.OperationalError("unable to open database file")

    with pytest.raises(sqlite3.OperationalError):
        await SQLiteWorker(broken).start()
