"""The SQLite store's connection: one file, WAL, one writer thread.

sqlite3 is a blocking driver, so every call runs on a single dedicated thread that owns the
connection (:mod:`.worker`), never on the event loop. One thread is also the right amount of
parallelism for SQLite, which admits one writer at a time; each public method of the store is
one function shipped to that thread and one transaction, so a call costs a single thread hop.

Writes use ``BEGIN IMMEDIATE``: the write lock is taken before the fencing check is read, so
the check and the write it guards are one atomic step even with several processes on one file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tether.errors import StoreError
from tether.store.sqlite.doorbell import Doorbell
from tether.store.sqlite.migrations import migrate
from tether.store.sqlite.scrub import Scrubber
from tether.store.sqlite.worker import SQLiteWorker

T = TypeVar("T")
VersionsKey = tuple[tuple[str, ...], str]
"""Namespace keys and a collection, as a memory-version read asks them."""
Stamp = tuple[int, int, int]
"""Local version changes, the data version and the rings, as a cached read was made under."""
log = logging.getLogger("tether.store")

BUSY_MS = 10_000
"""How long a statement waits for another process's lock before it fails."""
MIN_FREE_BYTES = 4 * 1024 * 1024
"""Below this much room on its disk the store is not ready: about one WAL's worth (SQLite
checkpoints at 1,000 pages), which ordinary traffic fills before the next checkpoint."""
PING_WITHIN = 2.0
"""Readiness answers within this many seconds: a store that cannot take a write by then (a
queue that long, a lock held that long by another process) is not ready."""


class Connection:
    """Plumbing every role of :class:`~tether.store.sqlite.SQLiteStore` runs its calls on."""

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: str = "NORMAL",
        min_free_bytes: int = MIN_FREE_BYTES,
    ) -> None:
        self.path = Path(path)
        # WAL + NORMAL survives any process crash (kill -9); FULL also survives power loss.
        self._synchronous = synchronous
        self._min_free_bytes = min_free_bytes
        self._worker: SQLiteWorker | None = None
        self._scrubber: Scrubber | None = None
        self._doorbell = Doorbell(self.path)
        self.migrated: tuple[int, int] | None = None
        """The schema's version before and after this store's first open applied what it
        lacked (``tether db upgrade`` says it)."""
        self._versions: dict[VersionsKey, tuple[Stamp, tuple[int, ...]]] = {}
        """Memory version reads and the stamp they were read under (:mod:`.recall`)."""

    async def _call(
        self, fn: Callable[[sqlite3.Connection], T], write: bool, alone: bool = False
    ) -> T:
        worker = self._worker
        if worker is None:
            raise StoreError("the store is not open")
        try:
            return await worker.call(fn, write=write, alone=alone)
        except sqlite3.Error as exc:
            name = getattr(exc, "sqlite_errorname", None) or exc.__class__.__name__
            raise StoreError(f"sqlite: {name}") from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read."""
        return await self._call(fn, False)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write: atomic on its own, possibly committed with others (group commit)."""
        return await self._call(fn, True)

    async def _alone(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A call outside any transaction (SQLite refuses a checkpoint inside one)."""
        return await self._call(fn, False, alone=True)

    async def open(self) -> None:
        if self._worker is not None:
            return
        # Every user's history, memory and key hashes are in this file: a directory and file
        # made here are the owner's alone (SQLite gives its -wal and -shm the file's mode). One
        # that exists already keeps the mode its owner gave it.
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass
        except OSError as exc:
            raise StoreError(f"sqlite: cannot open {self.path}: {exc}") from exc
        worker = SQLiteWorker(self._connect)
        try:
            await worker.start()
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: cannot open {self.path}: {exc}") from exc
        self._worker = worker
        self._scrubber = Scrubber(self.path, self._alone, busy_ms=BUSY_MS)
        # Every commit of ours rings the other processes on this file; this one hears theirs.
        worker.on_commit = self._doorbell.ring
        self._doorbell.listen()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_MS / 1000
        )
        _use_wal(conn)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={BUSY_MS}")
        # A bigger page cache keeps the hot B-tree pages of long sessions in memory.
        conn.execute("PRAGMA cache_size=-32000")
        # Freed cells are zeroed as they are freed (FAST: where that costs no extra I/O), so
        # that no stale copy of a row, left in a page by an update or a rebalance, outlives
        # the row's deletion; a forget turns it fully on to clear freed pages as well.
        conn.execute("PRAGMA secure_delete=FAST")
        versions = migrate(conn)
        self.migrated = self.migrated or versions
        return conn

    async def close(self) -> None:
        scrubber, self._scrubber = self._scrubber, None
        if scrubber is not None:
            await scrubber.close()  # while the thread runs: a last scrub may be owed
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.stop()
        self._doorbell.close()  # after the thread: it rings through the doorbell

    async def data_version(self) -> int:
        """SQLite's ``PRAGMA data_version``: it moves when another connection (another
        process on this file) commits, never for this connection's own commits."""
        worker = self._worker
        if worker is None:
            raise StoreError("the store is not open")
        return await self._run(worker.data_version)

    def heard(self) -> int | None:
        """How many times another process's commit has rung this store's doorbell; None when
        it cannot hear them (then only :meth:`data_version` tells)."""
        return self._doorbell.poll() if self._doorbell.listening else None

    async def hear(self, after: int) -> None:
        """Return once more than ``after`` rings were heard (at once when it cannot hear)."""
        await self._doorbell.hear(after)

    def thread_id(self) -> int | None:
        """The native id of the store's thread (None while the store is not open)."""
        worker = self._worker
        return worker.native_id if worker is not None else None

    def seen_version(self) -> int:
        """:meth:`data_version` as the store's thread last read it, before its latest batch of
        calls: no I/O. Unchanged since a value noted before a read, no other process had
        committed by the time the store last looked."""
        worker = self._worker
        return worker.version if worker is not None else 0

    async def ping(self) -> None:
        """Readiness: within :data:`PING_WITHIN`, the store can take a write — its thread
        answers, the write lock can be taken, and its disk has room."""
        try:
            async with asyncio.timeout(PING_WITHIN):
                await self._write(self._probe)
        except TimeoutError as exc:
            raise StoreError(f"sqlite: no write within {PING_WITHIN} s") from exc

    def _probe(self, _: sqlite3.Connection) -> None:
        # A write call: it runs inside BEGIN IMMEDIATE, so it holds the write lock, and it
        # fails with the other writes of its batch when their COMMIT fails. Writing nothing
        # itself, it cannot tell a full disk (an emptied WAL is rewritten in place), so the
        # room left is measured.
        st = os.statvfs(self.path.parent)
        if st.f_bavail * st.f_frsize < self._min_free_bytes:
            raise StoreError(f"sqlite: less than {self._min_free_bytes} bytes free")

    # -- scrubbing ---------------------------------------------------------------------------
    async def _scrub(self) -> None:
        """After a forget that deleted something: rewrite the file and empty the WAL, so
        that neither keeps a byte of it (:mod:`.scrub`); never fails the caller."""
        if self._scrubber is not None:
            await self._scrubber.after_forget()


def _use_wal(conn: sqlite3.Connection) -> None:
    """Put the file in WAL mode. On a fresh file that several processes open at once, the
    switch fails at once with "database is locked" for all but one (SQLite does not call the
    busy handler for it), so it is tried again until the busy timeout."""
    deadline = time.monotonic() + BUSY_MS / 1000
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
