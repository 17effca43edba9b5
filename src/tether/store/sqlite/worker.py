"""The thread that owns a SQLite connection, with group commit.

sqlite3 blocks, so it never runs on the event loop: every store call is shipped here as a
function. Calls that arrive while the thread is busy are run together: the writes of one batch
share one ``BEGIN IMMEDIATE … COMMIT`` (each inside its own SAVEPOINT, so one call's failure
rolls back that call alone; a write alone in its batch needs none, its failure rolls back the
whole transaction), and the results go back to each event loop in one wake-up. Under
concurrency this turns many small transactions — and as many thread hand-offs — into a few.

Ordering is what callers see from a single connection: calls run in arrival order, a read
sees every write queued before it, and a call's result is delivered only after the
transaction holding its write has committed. A call made ``alone`` (a WAL checkpoint, which
SQLite refuses inside a transaction) runs by itself, between batches.

Driver errors never stop the thread. When the transaction of a batch is lost — its COMMIT
failed, or SQLite ended it on its own after an error such as ``SQLITE_FULL`` — every call of
the batch gets the error (none of its writes is durable), the connection is brought back to no
open transaction (or replaced when it cannot be), and the next batch runs as usual: writes work
again as soon as the cause (a full disk, say) is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MAX_BATCH = 128
log = logging.getLogger("tether.store")


class _Op(Generic[T]):
    __slots__ = ("alone", "error", "fn", "future", "loop", "result", "write")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], T],
        write: bool,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
        alone: bool = False,
    ) -> None:
        self.fn = fn
        self.write = write
        self.alone = alone
        self.loop = loop
        self.future = future
        self.result: Any = None
        self.error: BaseException | None = None


class SQLiteWorker:
    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._conn: sqlite3.Connection | None = None
        self._queue: deque[_Op[Any]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name="tether-sqlite", daemon=True)
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._failing = False  # the last write transaction failed (logged once, not per batch)
        self._connections = 0
        self.on_commit: Callable[[], None] | None = None
        """Called on the thread after each write transaction commits (the doorbell's ring)."""
        self.version = 0
        """``PRAGMA data_version`` as the thread read it before its latest batch ran (with how
        many connections it had had: a new connection counts afresh), for
        :meth:`~tether.store.sqlite.connection.Connection.seen_version`. Written by the thread
        only; an int, so the event loop reads it whole."""

    async def start(self) -> None:
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self._start_error is not None:
            raise self._start_error

    @property
    def native_id(self) -> int | None:
        """The thread's id in the kernel once it runs (None before)."""
        return self._thread.native_id

    async def call(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool, alone: bool = False
    ) -> T:
        """Run ``fn`` on the thread: a read, a write (committed before the result is given),
        or ``alone``: by itself, outside any transaction."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._cond:
            if self._stopping:
                raise sqlite3.ProgrammingError("the store is closed")
            if not self._thread.is_alive():
                # Never expected (the thread catches everything), but a call must not wait
                # on a thread that will never answer it.
                raise sqlite3.OperationalError("the store's thread is not running")
            self._queue.append(_Op(fn, write and not alone, loop, future, alone))
            self._cond.notify()
        return await future

    async def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)

    # -- the thread ------------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._conn = self._connect()
        except BaseException as exc:
            self._start_error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._stopping:
                        self._cond.wait()
                    if not self._queue:
                        return  # stopping, and every queued call has been answered
                    batch = self._take()
                try:
                    self._execute(batch)
                except BaseException as exc:  # the thread outlives whatever one batch does
                    log.exception("the SQLite thread failed a batch")
                    _fail(batch, exc)
                    self._drop()
                self._deliver(batch)
        finally:
            self._drop()

    def _take(self) -> list[_Op[Any]]:
        """The next batch: the queued calls up to the next one that must run alone."""
        batch = [self._queue.popleft()]
        if batch[0].alone:
            return batch
        while self._queue and len(batch) < MAX_BATCH and not self._queue[0].alone:
            batch.append(self._queue.popleft())
        return batch

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:  # dropped after a failure it could not roll back
            self._conn = self._connect()
            self._connections += 1
        return self._conn

    def data_version(self, conn: sqlite3.Connection) -> int:
        """``PRAGMA data_version`` of ``conn`` (the thread's), told apart from its predecessors'."""
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return (self._connections << 48) + int(version)

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()  # rolls back whatever is still open

    def _execute(self, batch: list[_Op[Any]]) -> None:
        conn = self._connection()
        # Before the batch: a read in it sees every commit this number counts (a few µs).
        with contextlib.suppress(sqlite3.Error):
            self.version = self.data_version(conn)
        if batch[0].alone or not any(op.write for op in batch):
            for op in batch:
                self._run_one(conn, op)
            self._abandon(conn)  # a call that left a transaction open must not hold the next
            return
        # A write alone in its batch needs no savepoint: when it fails, the whole transaction
        # is rolled back (two statements fewer a call; most batches are one call when few
        # sessions are busy).
        marks = len(batch) > 1
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op in batch:
                if op.write and marks:
                    conn.execute("SAVEPOINT op")
                self._run_one(conn, op)
                if not conn.in_transaction:
                    # SQLite ended the whole transaction after this call's error (it does on
                    # SQLITE_FULL and I/O errors): the calls before it lost their writes too,
                    # and there is no savepoint left to go back to.
                    raise _lost(op.error)
                if op.write and marks:
                    if op.error is not None:
                        conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
            if marks or batch[0].error is None:
                conn.execute("COMMIT")
                if self.on_commit is not None:
                    self.on_commit()
            else:
                conn.execute("ROLLBACK")  # the lone call failed: nothing of it stays
        except sqlite3.Error as exc:
            # Whichever statement failed, nothing of the batch is durable: say so to all.
            self._abandon(conn)
            _fail(batch, exc)
            if not self._failing:
                self._failing = True
                log.warning(
                    "SQLite writes fail (%s: %s); their calls get StoreError until they work",
                    getattr(exc, "sqlite_errorname", type(exc).__name__),
                    exc,
                )
            return
        if self._failing:
            self._failing = False
            log.warning("SQLite writes work again")

    def _abandon(self, conn: sqlite3.Connection) -> None:
        """Leave no transaction open; a connection that cannot roll back is replaced."""
        if not conn.in_transaction:
            return  # SQLite rolled back itself (a failed COMMIT on a full disk, say)
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            log.warning("a SQLite transaction could not be rolled back; reconnecting")
            self._drop()

    @staticmethod
    def _run_one(conn: sqlite3.Connection, op: _Op[Any]) -> None:
        try:
            op.result = op.fn(conn)
        except BaseException as exc:  # delivered to the caller, whatever it is
            op.error = exc

    @staticmethod
    def _deliver(batch: list[_Op[Any]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[_Op[Any]]] = {}
        for op in batch:
            by_loop.setdefault(op.loop, []).append(op)
        for loop, ops in by_loop.items():
            # A closed loop raises RuntimeError: nobody there is waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, ops)


def _lost(error: BaseException | None) -> sqlite3.Error:
    if isinstance(error, sqlite3.Error):
        return error
    return sqlite3.OperationalError("a call ended the transaction of its batch")


def _fail(batch: list[_Op[Any]], exc: BaseException) -> None:
    """Every call of ``batch`` fails: with its own error, or else with ``exc``."""
    error = exc if isinstance(exc, sqlite3.Error) else sqlite3.OperationalError("internal error")
    for op in batch:
        op.error = op.error or error


def _resolve(ops: list[_Op[Any]]) -> None:
    for op in ops:
        if op.future.done():
            continue  # the caller was cancelled; the call still ran, like any started write
        if op.error is not None:
            op.future.set_exception(op.error)
        else:
            op.future.set_result(op.result)
