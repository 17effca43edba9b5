"""Rings between the processes that share one SQLite file: one's commit wakes the others.

PostgreSQL tells a process that another wrote (``LISTEN/NOTIFY``); SQLite does not, and
``PRAGMA data_version`` only answers when asked. Asking often (every 25-50 ms while a turn
runs or a lease lingers) cost a round trip to the store's thread each time, turn or no turn,
and asking rarely made a turn queued or cancelled from another process wait. So each process
that waits on others listens on a Unix datagram socket, registered in a directory beside the
database (``.tether.db.peers/``, a file per listener); every process that commits to the file
(a server, the CLI) sends each registered listener one byte after each write transaction it
commits. A ring says only "look": the listener's store reads ``data_version`` then, as before,
and a ring lost or never sent costs latency, never correctness (the pollers keep a slow
safety look).

Linux only: the sockets are in the abstract namespace (no file to clean up, no path length
limit; the directory only lists them). Elsewhere, and where the directory cannot be written,
nothing listens and the pollers look at their old pace.

A process killed with -9 leaves its registration behind: a ring to it is refused, and the
ringer removes the entry once the process it names is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import sys
import time
from pathlib import Path

log = logging.getLogger("tether.store")

PREFIX = b"\0tether-doorbell-"
"""The abstract socket address of a listener is this and its registration's name."""
RELIST = 1.0
"""Seconds after which a ringer lists the registrations again even if the directory's time has
not moved (a file system may keep times to the second)."""


def peers_dir(db: Path) -> Path:
    """Where the listeners on ``db`` register: beside it (``.tether.db.peers/``; hidden, and
    not named like SQLite's own ``tether.db-wal`` and ``-shm``, which tools copy together)."""
    return db.with_name(f".{db.name}.peers")


class Doorbell:
    """One store's end: it rings the others after each commit, and (once :meth:`listen` is
    called, on an event loop) hears them."""

    def __init__(self, db: Path) -> None:
        self.dir = peers_dir(db)
        self.heard = 0
        """Rings heard so far; moved only on the listener's event loop."""
        self._name: str | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._moved: asyncio.Event | None = None
        # The ringing side, used only by the store's thread.
        self._sender: socket.socket | None = None
        self._peers: list[str] = []
        self._seen_dir: int | None = None
        self._listed = 0.0

    @property
    def listening(self) -> bool:
        return self._sock is not None

    # -- hearing (the event loop) ----------------------------------------------------------------
    def listen(self) -> bool:
        """Bind this store's socket and register it; False (and nothing changed) where that
        cannot be done, so that callers poll instead."""
        if self._sock is not None:
            return True
        if not sys.platform.startswith("linux"):
            return False
        loop = asyncio.get_running_loop()
        name = f"{os.getpid()}-{secrets.token_hex(6)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind(PREFIX + name.encode())
            self.dir.mkdir(exist_ok=True)
            # Registered once bound: a ringer that finds the name can reach it.
            (self.dir / name).touch()
        except OSError as exc:
            sock.close()
            log.info(
                "no doorbell on %s (%s): looking for other processes' writes by polling",
                self.dir,
                exc,
            )
            return False
        self._sock, self._name, self._loop = sock, name, loop
        self._moved = asyncio.Event()
        loop.add_reader(sock.fileno(), self._on_ring)
        return True

    def poll(self) -> int:
        """The rings heard, counting those that have arrived and not been read yet: a ring is
        queued to this socket before the commit it announces returns to its writer, so
        whatever that writer did next (answer a client, who then asks here) comes after it."""
        sock = self._sock
        if sock is None:
            return self.heard
        got = False
        # Every ring queued since the last read is one piece of news: read them all. (A
        # try, not contextlib.suppress: this runs several times a turn, on the event loop.)
        try:
            while True:
                sock.recv(16)
                got = True
        except (BlockingIOError, InterruptedError):
            pass
        if got:
            self.heard += 1
            moved, self._moved = self._moved, asyncio.Event()
            if moved is not None:
                moved.set()
        return self.heard

    def _on_ring(self) -> None:
        self.poll()

    async def hear(self, after: int) -> None:
        """Return once more than ``after`` rings have been heard (at once when not listening;
        bound the wait with ``asyncio.timeout``)."""
        moved = self._moved
        if self.heard > after or moved is None:
            return
        await moved.wait()

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
            sock.close()
        if self._name is not None:
            with contextlib.suppress(OSError):
                (self.dir / self._name).unlink()
            self._name = None
        moved, self._moved = self._moved, None
        if moved is not None:
            moved.set()  # nothing more to hear: waiters look now (and poll from now on)
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    # -- ringing (the store's thread) ------------------------------------------------------------
    def ring(self) -> None:
        """After a commit: one byte to every other listener on the file. Never blocks, never
        raises: a listener whose queue is full has rings queued already."""
        try:
            stamp = os.stat(self.dir).st_mtime_ns
        except OSError:
            return  # nobody has ever listened on this file
        now = time.monotonic()
        if stamp != self._seen_dir or now - self._listed > RELIST:
            # Listeners came or went (a registration changes the directory; on a file system
            # whose times are coarse, only a while later): list them again.
            try:
                self._peers = [n for n in os.listdir(self.dir) if n != self._name]
            except OSError:
                return
            self._seen_dir, self._listed = stamp, now
        if not self._peers:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        for name in self._peers:
            try:
                self._sender.sendto(b"!", PREFIX + name.encode())
            except (BlockingIOError, InterruptedError):
                pass  # its queue is full: it has news to read already
            except ConnectionRefusedError:
                self._gone(name)
            except OSError:
                pass  # another network namespace, say: it polls

    def _gone(self, name: str) -> None:
        """Nobody listens under ``name``: remove its registration if its process is gone."""
        pid, _, _ = name.partition("-")
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
                return  # alive (a listener closing, or another pid namespace): leave it
            except ProcessLookupError:
                pass
            except OSError:
                return
        with contextlib.suppress(OSError):
            (self.dir / name).unlink()
