"""The SQLite worker under driver errors: a failed COMMIT, a call whose error ended the
transaction, a disk that fills up and empties again. Every call gets an answer (an error when
its write is not durable), and the worker keeps serving."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.tmpfs import fill, free_bytes, small_tmpfs
from tether.errors import StoreError
from tether.records import Namespace, SessionKey
from tether.store import SQLiteStore
from tether.store.sqlite.worker import SQLiteWorker
from tether.testing.conformance._support import put

T = TypeVar("T")
FULL = "database or disk is full"
# Only a guard against a hang: a call that never answers fails the test instead of blocking it.
NO_HANG = 30.0


async def answered(call: Awaitable[T]) -> T:
    return await asyncio.wait_for(call, NO_HANG)


class Flaky(sqlite3.Connection):
    """A connection whose next COMMITs fail, as SQLite's do when the disk is full: it rolls
    the transaction back itself (``rolls_back``) or leaves it open (a busy or I/O error)."""

    failing_commits = 0
    rolls_back = True

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT" and self.failing_commits:
            self.failing_commits -= 1
            if self.rolls_back:
                super().execute("ROLLBACK")
            raise sqlite3.OperationalError(FULL)
        return super().execute(sql, *args)


def _connect(path: Path) -> Flaky:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=Flaky)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY)")
    return conn


class Held:
    """Keeps the worker thread busy until released, so that the calls queued meanwhile run
    as one batch."""

    def __init__(self, worker: SQLiteWorker) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.call = asyncio.ensure_future(worker.call(self._hold, write=False))

    def _hold(self, _: sqlite3.Connection) -> None:
        self.started.set()
        self.release.wait(NO_HANG)

    async def __aenter__(self) -> Held:
        await asyncio.to_thread(self.started.wait, NO_HANG)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()
        await answered(self.call)


def insert(n: int) -> Callable[[sqlite3.Connection], int]:
    def do(c: sqlite3.Connection) -> int:
        c.execute("INSERT INTO t (n) VALUES (?)", (n,))
        return n

    return do


def rows(c: sqlite3.Connection) -> list[int]:
    return [r[0] for r in c.execute("SELECT n FROM t ORDER BY n")]


@pytest.fixture
def conns() -> list[Flaky]:
    """The connections the worker opened, the current one last."""
    return []


@pytest.fixture
async def worker(tmp_path: Path, conns: list[Flaky]) -> AsyncIterator[SQLiteWorker]:
    def connect() -> Flaky:
        conns.append(_connect(tmp_path / "f.db"))
        return conns[-1]

    w = SQLiteWorker(connect)
    await w.start()
    yield w
    await w.stop()


@pytest.mark.parametrize("rolls_back", [True, False], ids=["driver-rolled-back", "still-open"])
async def test_a_failed_commit_fails_its_calls_and_the_worker_keeps_serving(
    worker: SQLiteWorker, conns: list[Flaky], rolls_back: bool
) -> None:
    conn = conns[-1]
    conn.failing_commits, conn.rolls_back = 1, rolls_back
    async with Held(worker):
        calls = [asyncio.ensure_future(worker.call(insert(n), write=True)) for n in range(5)]
        read = asyncio.ensure_future(worker.call(rows, write=False))
    results = await answered(asyncio.gather(*calls, read, return_exceptions=True))
    # Nothing of the batch is durable, so no call of it may report success; the read ran in
    # the same transaction and saw writes that are gone, so it fails as well.
    assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
    # The thread is alive, the transaction is gone, and the next writes commit.
    assert await answered(worker.call(rows, write=False)) == []
    assert await answered(worker.call(insert(7), write=True)) == 7
    assert await answered(worker.call(rows, write=False)) == [7]


async def test_a_call_whose_error_ended_the_transaction_fails_the_whole_batch(
    worker: SQLiteWorker,
) -> None:
    def full(c: sqlite3.Connection) -> None:
        # What SQLite does on SQLITE_FULL mid-statement: the whole transaction is rolled back,
        # the savepoint with it ("ROLLBACK TO op" then has nothing to go back to).
        c.execute("INSERT INTO t (n) VALUES (100)")
        c.execute("ROLLBACK")
        raise sqlite3.OperationalError(FULL)

    async with Held(worker):
        before = asyncio.ensure_future(worker.call(insert(1), write=True))
        failing = asyncio.ensure_future(worker.call(full, write=True))
        after = asyncio.ensure_future(worker.call(insert(2), write=True))
    results = await answered(asyncio.gather(before, failing, after, return_exceptions=True))
    # The first call's write went with the transaction: it must not be told it committed.
    assert all(isinstance(r, sqlite3.OperationalError) for r in results), results
    assert await answered(worker.call(rows, write=False)) == []
    assert await answered(worker.call(insert(3), write=True)) == 3
    assert await answered(worker.call(rows, write=False)) == [3]


async def test_a_failure_outside_any_call_still_answers_every_call(
    worker: SQLiteWorker, conns: list[Flaky]
) -> None:
    conn = conns[-1]

    def release_fails(c: sqlite3.Connection) -> int:
        # The call succeeds, and then the worker's own RELEASE fails: the savepoint is gone.
        c.execute("INSERT INTO t (n) VALUES (5)")
        c.execute("RELEASE op")
        return 5

    async with Held(worker):
        calls = [
            asyncio.ensure_future(worker.call(insert(4), write=True)),
            asyncio.ensure_future(worker.call(release_fails, write=True)),
        ]
    results = await answered(asyncio.gather(*calls, return_exceptions=True))
    assert all(isinstance(r, sqlite3.Error) for r in results), results
    assert not conn.in_transaction or conns[-1] is not conn
    assert await answered(worker.call(insert(6), write=True)) == 6
    assert await answered(worker.call(rows, write=False)) == [6]


# -- a real disk that fills up ---------------------------------------------------------------
KEY = SessionKey("acme", "alice", "s1")


async def test_a_full_disk_fails_writes_with_store_error_and_recovers(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path, 8, __file__) as mnt:
        store = SQLiteStore(mnt / "tether.db")
        await store.open()
        try:
            await store.create_session(KEY, "assistant")
            await store.ping()
            filler = fill(mnt)
            assert free_bytes(mnt) == 0
            ns = Namespace.user("acme", "alice")
            big = "zq " * 400_000  # needs new pages whatever the WAL already holds
            for n in range(3):  # again and again: the worker survives each failure
                with pytest.raises(StoreError):
                    await answered(put(store, ns, f"m{n}", big))
            # Reads still answer, and readiness says the store cannot write.
            assert (await answered(store.get_session(KEY))) is not None
            with pytest.raises(StoreError):
                await answered(store.ping())

            filler.unlink()
            await answered(store.ping())
            await answered(put(store, ns, "m9", big))
            assert await store.get_memory(ns, "m9") is not None
        finally:
            await store.close()


async def test_readiness_fails_within_its_bound_while_writes_cannot_happen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tether.store.sqlite import connection

    monkeypatch.setattr(connection, "PING_WITHIN", 0.3, raising=False)
    path = tmp_path / "tether.db"
    store = SQLiteStore(path)
    await store.open()
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        await store.ping()
        # Another process holds the write lock: reads go on, no write can commit meanwhile.
        other.execute("BEGIN IMMEDIATE")
        assert await answered(store.get_session(KEY)) is None
        with pytest.raises(StoreError):
            await answered(store.ping())
        other.execute("ROLLBACK")
        await answered(store.ping())
    finally:
        other.close()
        await store.close()
