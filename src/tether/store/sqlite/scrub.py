"""What a forget leaves in a SQLite file, scrubbed: the file rewritten, the WAL emptied.

``secure_delete`` zeroes a row where it lives when it is deleted, but a copy that a B-tree
rebalance left in a page's unused space (the row, or an older version of it, moved to another
page) is no row and stays; only rewriting every page (``VACUUM``) removes such copies. Old
page images stay in the write-ahead log until a ``wal_checkpoint(TRUNCATE)`` folds it into the
file and empties it. Both run as calls of their own on the store's thread, outside any
transaction (SQLite refuses them inside one), and never fail a forget: its deletion has
committed. When another process holds the write lock or an old snapshot, or there is no room
for the copy, the scrub is tried again, then in the background.

One scrub serves every forget that committed before it began (the rewrite costs the whole
file: ~5 ms a MB on the 2-core test machine); a forget that deleted nothing asks for none.
While a rewrite's copy still sits in the WAL (a reader holding an old snapshot keeps the
checkpoint from emptying it), no second copy is written on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tether.errors import StoreError

Alone = Callable[[Callable[[sqlite3.Connection], Any]], Awaitable[Any]]
"""Runs a call on the store's thread, by itself, outside any transaction."""

log = logging.getLogger("tether.store")

ATTEMPT_BUSY_MS = 50
"""A ``VACUUM`` or checkpoint waits this long for another process's lock or readers: the
store's one thread serves nobody else meanwhile, so attempts are short and repeated."""
PAUSES = (0.02, 0.05, 0.1, 0.2, 0.4)
"""Pauses between the attempts made before a forget answers (0.77 s in all, besides the
attempts themselves)."""
LATER = 2.0
LATER_TRIES = 300
"""Then, in the background: an attempt every ``LATER`` s, this many times at most (10 minutes;
closing the store stops them, after one last attempt)."""
MARGIN = 4 * 1024 * 1024
"""Room kept free besides the copy a rewrite needs, in the database's directory and in
SQLite's temporary one."""


class Scrubber:
    """The scrubs of one SQLite file, on one store's thread."""

    def __init__(self, path: Path, alone: Alone, *, busy_ms: int) -> None:
        self._path = path
        self._alone = alone
        self._vacuum = functools.partial(_vacuum, busy_ms=busy_ms)
        self._checkpoint = functools.partial(_checkpoint, busy_ms=busy_ms)
        self._asked = 0
        """Forgets whose deletions have committed: what the scrubs must cover."""
        self._rewritten = 0
        """Forgets the latest ``VACUUM`` covers (those that committed before it began)."""
        self._done = 0
        """Forgets whose traces are gone: rewritten, and the WAL emptied since."""
        self._copy_in_wal = False
        """A ``VACUUM``'s copy of the file is in the WAL, not yet folded in and emptied."""
        self._pass: asyncio.Task[bool] | None = None
        self._later: asyncio.Task[None] | None = None
        self._closed = False
        self._no_room_told = False

    @property
    def pending(self) -> bool:
        """Some forget's traces may still be in the file or its WAL."""
        return self._done < self._asked

    async def after_forget(self) -> None:
        """Scrub what a forget that has just committed deleted; return once it is done, or
        once the attempts before answering are spent (the background goes on)."""
        self._asked += 1
        mine = self._asked
        while self._done < mine and not self._closed:
            task = self._pass
            if task is None or task.done():
                task = self._pass = asyncio.create_task(self._attempts(PAUSES))
            try:
                ok = await asyncio.shield(task)
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this caller is cancelled: the scrub goes on for the others
                return  # the store closes under it: close() makes the last attempt
            if self._done >= mine:
                return  # covered, though the pass went on for forgets that came later
            if not ok:
                log.warning("the SQLite file could not be scrubbed yet after a forget; retrying")
                self._go_on_later()
                return
            # A scrub that began before this forget committed does not cover it: once it
            # ends, the loop starts the next (one for every forget that came meanwhile).

    async def close(self) -> None:
        """Stop the retries; one last attempt if a scrub is still owed (the store's thread
        still runs), and an error in the log when that fails too."""
        self._closed = True
        for task in (self._pass, self._later):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self.pending and not await self._attempt():
            log.error(
                "the SQLite file could not be scrubbed before the store closed (another process"
                " holds it busy, or there is no room for a copy): deleted data may remain in"
                " %s until a later forget scrubs it",
                self._path,
            )

    def _go_on_later(self) -> None:
        if self._closed or (self._later is not None and not self._later.done()):
            return  # the retries under way read what is owed at each attempt
        self._later = asyncio.create_task(self._retry_later())

    async def _retry_later(self) -> None:
        if await self._attempts((LATER,) * LATER_TRIES, first=False) or not self.pending:
            log.warning("the SQLite file is scrubbed")
        elif not self._closed:
            log.error("the SQLite file could not be scrubbed: deleted data may remain in it")

    async def _attempts(self, pauses: tuple[float, ...], *, first: bool = True) -> bool:
        for pause in (0.0, *pauses) if first else pauses:
            await asyncio.sleep(pause)
            if self._closed:
                return False
            if await self._attempt() and not self.pending:
                return True
        return False

    async def _attempt(self) -> bool:
        """One try at everything owed now; True when it is all done."""
        target = self._asked
        try:
            if self._rewritten < target:
                # A copy already in the WAL goes first: a reader holding an old snapshot
                # must not make each forget add one more copy of the file to the log.
                if self._copy_in_wal and not await self._alone(self._checkpoint):
                    return False
                self._copy_in_wal = False
                if self._room_for_copy() and await self._alone(self._vacuum):
                    self._rewritten, self._copy_in_wal = target, True
            # Always: after a rewrite, and after one that failed midway (its pages are in the
            # WAL), the log is folded in and emptied.
            if not await self._alone(self._checkpoint):
                return False
            self._copy_in_wal = False
            if self._rewritten < target:
                return False
            self._done = max(self._done, target)
            return True
        except StoreError:
            return False  # closed meanwhile, or the disk is full: the next attempt decides

    def _room_for_copy(self) -> bool:
        """Room for what a ``VACUUM`` writes: a copy of the file in the WAL, beside it, and
        one in SQLite's temporary directory (past what fits in its page cache)."""
        try:
            size = self._path.stat().st_size
            places = {self._path.parent, _sqlite_temp_dir()}
            room = all(_free(place) >= size + MARGIN for place in places)
        except OSError:
            return True  # cannot tell: let SQLite try (it fails cleanly when full)
        if not room and not self._no_room_told:
            log.warning(
                "no room to rewrite %s after a forget (it needs about its size free beside it"
                " and in SQLite's temporary directory): deleted data may remain in it until"
                " there is",
                self._path,
            )
        self._no_room_told = not room
        return room


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _sqlite_temp_dir() -> Path:
    """Where SQLite's unix VFS puts temporary files: the first directory of these that is
    there and writable."""
    for candidate in (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR")):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    for candidate in ("/var/tmp", "/usr/tmp", "/tmp"):
        if os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(candidate)
    return Path(".")


def _vacuum(c: sqlite3.Connection, *, busy_ms: int) -> bool:
    """One ``VACUUM``: every page written anew, a copy of the live rows and nothing else."""
    return _briefly(c, sql="VACUUM", busy_ms=busy_ms) is not None


def _checkpoint(c: sqlite3.Connection, *, busy_ms: int) -> bool:
    """One ``wal_checkpoint(TRUNCATE)``: True when the WAL is empty."""
    row = _briefly(c, sql="PRAGMA wal_checkpoint(TRUNCATE)", busy_ms=busy_ms)
    return row is not None and int(row[0]) == 0


def _briefly(c: sqlite3.Connection, *, sql: str, busy_ms: int) -> tuple[Any, ...] | None:
    """``sql`` waiting at most ``ATTEMPT_BUSY_MS`` for another process's lock, then
    the connection's ``busy_ms`` again; its first row (``()`` when none), or None when it
    failed (SQLITE_BUSY, or SQLITE_FULL when the disk cannot take the pages)."""
    c.execute(f"PRAGMA busy_timeout={ATTEMPT_BUSY_MS}")
    try:
        row = c.execute(sql).fetchone()
    except sqlite3.OperationalError:
        return None
    finally:
        c.execute(f"PRAGMA busy_timeout={busy_ms}")
    return tuple(row) if row is not None else ()
