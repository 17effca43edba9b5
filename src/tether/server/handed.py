"""Connections under ``tether serve --workers N``: the parent accepts, the workers serve.

When N workers each accepted on one shared socket, the kernel woke them all for a new
connection and the first one awake took the whole burst (uvloop's listener, asyncio's too,
accepts until nothing is left): 64 keep-alive clients connecting at once were split 57/7, and
64/0, between two workers, and stayed that way for as long as they stayed connected, so one
core did the work of two. Taking one connection a wake-up did not help: the worker already
awake wins each time.

So the parent accepts (:class:`Dispatch`) and hands each connection, as a file descriptor over
a Unix socket of the worker's own (``SCM_RIGHTS``), to a worker that has room: each may have
at most :data:`CREDITS` connections handed and not yet taken. A worker takes one as its event
loop gets to it, and says so (one byte); the parent keeps its own copy until then. So:

* a burst goes to the workers as fast as each takes its share, evenly when they are equally
  free, more to the freer one when they are not (as accepting for themselves did, minus the
  grab);
* a worker whose loop is stuck gets at most :data:`CREDITS` connections before the parent
  stops giving it more, and when no worker has room the parent stops accepting: connections
  wait in the listening socket's backlog, as they did;
* a connection handed to a worker that dies before it takes it goes to another worker, whole
  (the worker says it took one before it reads a byte of it).

:class:`Handed` is a worker's end: it stands where uvicorn's listener would, and gives each
connection to uvicorn's own protocol, as its listener would have.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

log = logging.getLogger("tether.serve")

CREDITS = 8
"""Connections handed to one worker and not yet taken, at most: a burst flows while each
worker takes what it is given, and a stuck worker strands this many at most."""
ACCEPT_PAUSE = 0.1
"""Seconds the parent stops accepting when it is out of file descriptors (or memory), as
asyncio's listener does: the connections wait in the backlog instead of the loop spinning."""
REFUSED_PAUSE = 1.0
"""Seconds a worker that could not take a connection (out of file descriptors) is given no
other; the connection goes to another worker."""

TOOK, REFUSED = b"a", b"n"
"""What a worker says of each connection handed to it, in the order they came."""

MAX_MESSAGES = 64
"""Messages a worker reads a wake-up at most (one connection each)."""

# Received descriptors are not inherited by what a worker starts (a sandboxed tool, say).
# Linux marks them so as they arrive; elsewhere each is marked after.
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_FDS_SPACE = socket.CMSG_SPACE(4 * array.array("i").itemsize)
_EXHAUSTED = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
_GONE = {errno.EPIPE, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENOTCONN}


# -- the parent ----------------------------------------------------------------------------------
@dataclass
class _Worker:
    channel: socket.socket
    """The parent's end of the worker's Unix socket (non-blocking)."""
    ready: bool = False
    unacked: deque[socket.socket] = field(default_factory=deque)
    """Connections handed and not yet taken, oldest first: the parent's copies, kept open so
    that one a worker never took can go to another."""
    refused_until: float = 0.0


class Dispatch:
    """The parent's side: accepts on ``listening`` and hands the connections out.

    Driven by the supervisor's loop: :meth:`watched` says which descriptors to wait on,
    :meth:`handle` does what the readable ones ask. Workers are known by a key of the caller's
    (:meth:`open` before the fork, :meth:`ready` once the worker serves, :meth:`gone` once it
    has exited)."""

    def __init__(self, listening: socket.socket) -> None:
        listening.setblocking(False)
        self.listening: socket.socket | None = listening
        self._workers: dict[Hashable, _Worker] = {}
        self._waiting: deque[socket.socket] = deque()
        """Accepted, or given back by a worker, and not handed out yet (first out first)."""
        self._next = 0  # where the round of the workers starts next
        self._paused_until = 0.0
        self._troubles = 0  # accept failures so far (the log says the first few, then fewer)

    # -- workers -------------------------------------------------------------------------------
    def open(self, key: Hashable) -> socket.socket:
        """A channel for the worker about to start under ``key``: the worker's end, which the
        caller passes to the worker and closes in the parent."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        self._workers[key] = _Worker(ours)
        return theirs

    def ready(self, key: Hashable) -> None:
        worker = self._workers.get(key)
        if worker is not None:
            worker.ready = True

    def gone(self, key: Hashable) -> None:
        """The worker under ``key`` has exited: what it said it took is closed here, what it
        never took goes to another."""
        worker = self._workers.pop(key, None)
        if worker is None:
            return
        self._read_acks(worker)  # said before it died: taken, not to be handed again
        worker.channel.close()
        self._waiting.extendleft(reversed(worker.unacked))
        worker.unacked.clear()
        if self.listening is None:  # stopping: nobody will serve them
            self._close_waiting()
        else:
            self._hand_waiting(time.monotonic())

    def stop(self) -> None:
        """Accept no more: the port refuses connections (the workers closed their copies of
        it as they started), and those not handed out yet are closed, as the backlog's were."""
        if self.listening is not None:
            self.listening.close()
            self.listening = None
        self._close_waiting()

    def close(self) -> None:
        """Every socket the parent holds, closed (the end of the supervisor)."""
        self.stop()
        for worker in self._workers.values():
            for conn in worker.unacked:
                conn.close()
            worker.channel.close()
        self._workers.clear()

    def forget(self) -> None:
        """In a worker just forked: close the parent's sockets it inherited (the listening
        one, the channels, the connections the parent holds), or a connection another worker
        closes would stay open through this one."""
        self.close()

    # -- the loop ------------------------------------------------------------------------------
    def watched(self, now: float) -> list[int]:
        """The descriptors to wait on: the listening socket while a worker has room and
        nothing waits to be handed, and the channels of workers with connections to take."""
        fds = [w.channel.fileno() for w in self._workers.values() if w.unacked]
        if (
            self.listening is not None
            and not self._waiting
            and now >= self._paused_until
            and self._pick(now, take=False) is not None
        ):
            fds.append(self.listening.fileno())
        return fds

    def wake_at(self, now: float) -> float | None:
        """When the loop must look again on its own (a pause ending), if it must: only pauses
        still to end count (one that has ended must not make the loop spin)."""
        if self.listening is None:
            return None
        due = [self._paused_until]
        if self._waiting:
            due += [w.refused_until for w in self._workers.values()]
        later = [t for t in due if t > now]
        return min(later) if later else None

    def handle(self, readable: list[int], now: float) -> None:
        """Read what the workers said, hand out what waits, then accept what the listening
        socket has, as long as a worker has room."""
        for key, worker in list(self._workers.items()):
            said = worker.unacked and worker.channel.fileno() in readable
            if said and not self._read_acks(worker):
                # Its channel ended: the worker is going, and what it had not taken was dropped
                # with its end, unread. Its exit is seen later (gone() again, which is a no-op).
                self.gone(key)
        self._hand_waiting(now)
        if self.listening is None or self.listening.fileno() not in readable:
            return
        while not self._waiting and now >= self._paused_until:
            if self._pick(now, take=False) is None:
                return  # the rest wait in the backlog until a worker takes what it has
            try:
                conn, _ = self.listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _EXHAUSTED:
                    raise
                self._paused_until = now + ACCEPT_PAUSE
                self._trouble(f"cannot accept a connection now ({exc}); pausing a moment")
                return
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._waiting.append(conn)
            self._hand_waiting(now)

    # -- inside --------------------------------------------------------------------------------
    def _pick(self, now: float, *, take: bool = True) -> _Worker | None:
        """The next ready worker in turn that has room (the turn moves on when ``take``): in
        turn, so that workers equally free get a burst evenly, and a worker that falls
        :data:`CREDITS` behind is passed over until it catches up."""
        workers = list(self._workers.values())
        for k in range(len(workers)):
            index = (self._next + k) % len(workers)
            worker = workers[index]
            if worker.ready and worker.refused_until <= now and len(worker.unacked) < CREDITS:
                if take:
                    self._next = (index + 1) % len(workers)
                return worker
        return None

    def _hand_waiting(self, now: float) -> None:
        while self._waiting:
            worker = self._pick(now)
            if worker is None:
                return
            conn = self._waiting[0]
            try:
                socket.send_fds(worker.channel, [b"c"], [conn.fileno()])
            except OSError as exc:
                if exc.errno in _GONE:
                    worker.ready = False  # it has just died: gone() follows
                else:
                    # Its channel is full, or the kernel is short of memory: a moment later.
                    worker.refused_until = now + ACCEPT_PAUSE
                continue
            self._waiting.popleft()
            worker.unacked.append(conn)

    def _read_acks(self, worker: _Worker) -> bool:
        """Take in what ``worker`` said of the connections handed to it; False when its
        channel has ended (the worker is gone or going)."""
        now = time.monotonic()
        while True:
            try:
                said = worker.channel.recv(16)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError:
                return False
            if not said:
                return False
            for answer in said:
                if not worker.unacked:
                    break
                conn = worker.unacked.popleft()
                if answer == REFUSED[0]:
                    # Out of descriptors there: another worker, or this one in a while.
                    worker.refused_until = now + REFUSED_PAUSE
                    self._waiting.appendleft(conn)
                else:
                    conn.close()  # the worker has its own copy now

    def _close_waiting(self) -> None:
        while self._waiting:
            self._waiting.popleft().close()

    def _trouble(self, message: str) -> None:
        self._troubles += 1
        if self._troubles <= 3 or self._troubles % 1000 == 0:
            log.warning("%s (%d so far)", message, self._troubles)


# -- a worker ------------------------------------------------------------------------------------
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
        self._unsaid = b""  # answers the channel had no room for yet, in order
        channel.setblocking(False)

    def start(self) -> None:
        if not self._serving:
            self._serving = True
            self._loop.add_reader(self._fd, self._receive)

    def _receive(self) -> None:
        for _ in range(MAX_MESSAGES):
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
            for extra in fds[1:]:
                os.close(extra)  # one connection a message: never more (closed, not leaked)
            # Said before a byte of it is read: until then, if this worker dies, the parent
            # gives the connection to another.
            self._say(TOOK if fds else REFUSED)
            if fds:
                self._serve(fds[0])

    def _say(self, answer: bytes = b"") -> None:
        """Send ``answer`` after any the channel had no room for: unsaid, the parent would
        hold its copy of that connection, and this worker one slot fewer, for good."""
        said = self._unsaid + answer
        if not said:
            return
        try:
            self._channel.send(said)  # several answers in one message: the parent reads each
        except BlockingIOError:
            if not self._unsaid:
                self._loop.add_writer(self._fd, self._say)
            self._unsaid = said
            return
        except OSError:
            said = b""  # the parent is gone: nobody to tell
        if self._unsaid:
            self._loop.remove_writer(self._fd)
        self._unsaid = b""

    def _serve(self, fd: int) -> None:
        try:
            conn = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # not a socket (it cannot happen; close what came)
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
                if self._unsaid:
                    self._loop.remove_writer(self._fd)

    async def wait_closed(self) -> None:
        if self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)


def _receive_fds(channel: socket.socket) -> tuple[bytes, list[int]]:
    """One message and the descriptors it carries; none when they could not be received (out
    of descriptors here: the kernel drops them and says so with ``MSG_CTRUNC``).
    ``socket.recv_fds`` would do, but for the flags it takes and drops (Python 3.11: received
    descriptors were left inheritable)."""
    data, ancdata, _, _ = channel.recvmsg(16, _FDS_SPACE, _CLOEXEC)
    fds = array.array("i")
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)
