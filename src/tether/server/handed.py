"""A worker's listener under ``tether serve --workers N``: connections the parent accepted.

When N workers each accepted on one shared socket, the kernel woke them all for a new
connection and the first one awake took the whole burst (uvloop's listener, asyncio's too,
accepts until nothing is left): 64 keep-alive clients connecting at once were split 57/7, and
64/0, between two workers, and stayed that way for as long as they stayed connected, so one
core did the work of two. Taking one connection a wake-up did not help: the worker already
awake wins each time. So the parent accepts, and hands each connection in turn to the next
worker (:class:`~tether.server.workers.Supervisor`), as a file descriptor over a Unix socket
of its own (``SCM_RIGHTS``); a burst is split evenly whatever each worker was doing.

Here is the receiving end: :class:`Handed` stands where uvicorn's listener would, and gives
each connection to uvicorn's own protocol, as its listener would have.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

log = logging.getLogger("tether.serve")

MAX_FDS = 64
"""Connections read a wake-up at most (the parent sends one a message)."""

# Received descriptors are not inherited by what a worker starts (a sandboxed tool, say).
# Linux marks them so as they arrive; elsewhere each is marked after.
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_FDS_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


def send_connection(channel: socket.socket, conn: socket.socket) -> None:
    """The parent's side: hand ``conn`` to the worker at the other end of ``channel``. Raises
    ``BlockingIOError`` when the worker is that far behind, ``OSError`` when it is gone."""
    socket.send_fds(channel, [b"c"], [conn.fileno()])


def read_acks(channel: socket.socket) -> int | None:
    """The parent's side: how many connections the worker says it took since last read (in
    the order they were handed); None when the worker is gone."""
    took = 0
    while True:
        try:
            data = channel.recv(4096)
        except (BlockingIOError, InterruptedError):
            return took
        except OSError:
            return None
        if not data:
            return None
        took += len(data)


class Handed:
    """``loop.create_server``'s part for connections arriving on ``channel``: each goes to
    ``protocol`` on this loop. :meth:`close` stops taking them; the channel is the caller's
    (uvicorn closes it with its sockets)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        channel: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        self._loop = loop
        self._channel = channel
        self._protocol = protocol
        self._fd = channel.fileno()
        self._serving = False
        self._starting: set[asyncio.Task[None]] = set()
        channel.setblocking(False)

    def start(self) -> None:
        if not self._serving:
            self._serving = True
            self._loop.add_reader(self._fd, self._receive)

    def _receive(self) -> None:
        for _ in range(MAX_FDS):
            try:
                data, fds = _receive_fds(self._channel)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.error("the parent's connections cannot be read (%s); taking no more", exc)
                self.close()
                return
            if not data and not fds:
                self.close()  # the parent is gone (and this worker is told to stop)
                return
            # Said before anything is read from them: until then, a worker that dies has not
            # touched them, and the parent gives them to another.
            with contextlib.suppress(OSError):
                self._channel.send(b"a" * len(fds))
            for fd in fds:
                self._serve(fd)

    def _serve(self, fd: int) -> None:
        try:
            conn = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # not a socket any more (it cannot happen; close what came)
            return
        if not _CLOEXEC:
            os.set_inheritable(fd, False)
        conn.setblocking(False)
        task = self._loop.create_task(self._connect(conn))
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._protocol, conn)
        except OSError:
            conn.close()  # the client went away before it could be served

    def close(self) -> None:
        if self._serving:
            self._serving = False
            with contextlib.suppress(OSError, ValueError):
                self._loop.remove_reader(self._fd)

    async def wait_closed(self) -> None:
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)


def _receive_fds(channel: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors it carries. ``socket.recv_fds`` would do, but for the
    flags it takes and drops (Python 3.11: received descriptors were left inheritable)."""
    data, ancdata, _, _ = channel.recvmsg(16, _FDS_SPACE, _CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)
