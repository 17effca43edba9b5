"""The thread that owns a SQLite connection, with group commit.

sqlite3 blocks, so it never runs on the event loop: every store call is shipped here as a
function. Calls that arrive while the thread is busy are run together: the writes of one batch
share one ``BEGIN IMMEDIATE … COMMIT`` (each inside its own SAVEPOINT, so one call's failure
rolls back that call alone), and the results go back to each event loop in one wake-up. Under
concurrency this turns many small transactions — and as many thread hand-offs — into a few.

Ordering is what callers see from a single connection: calls run in arrival order, a read
sees every write queued before it, and a call's result is delivered only after the
transaction holding its write has committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

MAX_BATCH = 128


class _Op(Generic[T]):
    __slots__ = ("error", "fn", "future", "loop", "result", "write")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], T],
        write: bool,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
    ) -> None:
        self.fn = fn
        self.write = write
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

    async def start(self) -> None:
        self._thread.start()
        await asyncio.get_running_loop().run_in_executor(None, self._ready.wait)
        if self._start_error is not None:
            raise self._start_error

    async def call(self, fn: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._cond:
            if self._stopping:
                raise sqlite3.ProgrammingError("the store is closed")
            self._queue.append(_Op(fn, write, loop, future))
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
                    batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
                self._execute(batch)
                self._deliver(batch)
        finally:
            self._conn.close()

    def _execute(self, batch: list[_Op[Any]]) -> None:
        conn = self._conn
        assert conn is not None
        if not any(op.write for op in batch):
            for op in batch:
                self._run_one(conn, op)
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            for op in batch:
                op.error = exc
            return
        for op in batch:
            if not op.write:
                self._run_one(conn, op)
                continue
            conn.execute("SAVEPOINT op")
            self._run_one(conn, op)
            if op.error is not None:
                conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.execute("ROLLBACK")
            for op in batch:
                op.error = op.error or exc  # nothing of the batch is durable: say so to all

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


def _resolve(ops: list[_Op[Any]]) -> None:
    for op in ops:
        if op.future.done():
            continue  # the caller was cancelled; the call still ran, like any started write
        if op.error is not None:
            op.future.set_exception(op.error)
        else:
            op.future.set_result(op.result)
