"""The parent's hand-over of connections to workers (``tether serve --workers N``), in one
process: real sockets, the parent's :class:`~tether.server.handed.Dispatch`, no fork.

A connection goes to the ready workers in turn, each with at most ``CREDITS`` handed and not
taken; when none has room the parent stops accepting; it keeps its copy until the worker says
it took it, so one handed to a worker that dies first (or cannot take it) is served by another,
and one it took is never handed again. A worker's :class:`~tether.server.handed.Handed` serves
what arrives with the protocol it is given."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import select
import socket
import sys
import time
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tether.server import handed
from tether.server.handed import CREDITS, REFUSED, TOOK, Dispatch, Handed

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="SCM_RIGHTS over SOCK_SEQPACKET (Linux)"
)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0), backlog=128) as sock:
        yield sock


class Parent:
    """A dispatch with ``workers`` ready workers (keys 0, 1, …) and their ends of the channels,
    driven as the supervisor's loop drives it."""

    def __init__(self, listening: socket.socket, workers: int) -> None:
        self.listening = listening
        self.dispatch = Dispatch(listening)
        self.ends = [self.dispatch.open(key) for key in range(workers)]
        for key, end in enumerate(self.ends):
            end.settimeout(5)
            self.dispatch.ready(key)
        self.clients: list[socket.socket] = []

    def connect(self, count: int = 1) -> list[socket.socket]:
        made = [
            socket.create_connection(self.listening.getsockname(), timeout=5) for _ in range(count)
        ]
        self.clients += made
        return made

    def turn(self) -> None:
        """One pass of the supervisor's loop: what is readable now, handled."""
        watched = self.dispatch.watched(time.monotonic())
        readable = select.select(watched, [], [], 0.05)[0] if watched else []
        self.dispatch.handle(readable, time.monotonic())

    def close(self) -> None:
        self.dispatch.close()
        for sock in (*self.ends, *self.clients):
            sock.close()


def take(end: socket.socket, say: bytes = TOOK) -> socket.socket:
    """What a worker does: receive a connection, say it took it."""
    _, fds, _, _ = socket.recv_fds(end, 16, 4)
    assert len(fds) == 1, fds
    end.send(say)
    conn = socket.socket(fileno=fds[0])
    conn.settimeout(5)
    return conn


def unacked(parent: Parent, key: int) -> int:
    return len(parent.dispatch._workers[key].unacked)


@pytest.fixture
def parent(listening: socket.socket) -> Iterator[Parent]:
    made = Parent(listening, 2)
    yield made
    made.close()


def test_connections_go_to_the_ready_workers_in_turn(parent: Parent) -> None:
    parent.connect(4)
    for _ in range(4):
        parent.turn()
    assert (unacked(parent, 0), unacked(parent, 1)) == (2, 2)
    got = [take(parent.ends[0]), take(parent.ends[1]), take(parent.ends[0]), take(parent.ends[1])]
    # Each is the client's own connection: what a client writes, one worker reads.
    for n, client in enumerate(parent.clients):
        client.sendall(f"client {n}".encode())
    assert sorted(conn.recv(64).decode() for conn in got) == [f"client {n}" for n in range(4)]
    parent.turn()  # the workers said they took them: the parent's copies are closed
    assert (unacked(parent, 0), unacked(parent, 1)) == (0, 0)
    for conn in got:
        conn.close()


def test_a_worker_not_ready_gets_none(listening: socket.socket) -> None:
    parent = Parent(listening, 3)
    try:
        parent.dispatch._workers[1].ready = False  # starting again
        parent.connect(4)
        for _ in range(4):
            parent.turn()
        assert [unacked(parent, k) for k in range(3)] == [2, 0, 2]
    finally:
        parent.close()


def test_a_worker_that_does_not_take_is_passed_over_and_then_nobody_accepts(
    parent: Parent,
) -> None:
    # Worker 1 takes what it is given; worker 0's loop is stuck: it gets CREDITS, no more.
    parent.connect(CREDITS * 2 + 5)
    taken = []
    for _ in range(CREDITS * 4):
        parent.turn()
        while unacked(parent, 1):
            taken.append(take(parent.ends[1]))
            parent.turn()
    assert unacked(parent, 0) == CREDITS
    assert len(taken) == CREDITS + 5
    # Now worker 1 is stuck too: once both are full the parent accepts no more, and the rest
    # wait in the listening socket's backlog.
    more = parent.connect(CREDITS + 3)
    for _ in range(4):
        parent.turn()
    assert (unacked(parent, 0), unacked(parent, 1)) == (CREDITS, CREDITS)
    assert parent.listening.fileno() not in parent.dispatch.watched(time.monotonic())
    # Worker 0 catches up: the waiting connections flow again, none was dropped.
    for _ in range(CREDITS):
        take(parent.ends[0]).close()
    for _ in range(4):
        parent.turn()
    assert (unacked(parent, 0), unacked(parent, 1)) == (3, CREDITS)  # all handed out now
    for conn in taken:
        conn.close()
    for client in more:
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(1)  # still open: waiting, not closed


def test_connections_a_worker_dies_before_taking_go_to_another(parent: Parent) -> None:
    parent.connect(4)
    for _ in range(4):
        parent.turn()
    first = take(parent.ends[0])  # worker 0 took one, said so, and dies with one untaken
    parent.ends[0].close()
    parent.turn()  # its channel ended: the untaken one goes to worker 1
    parent.dispatch.gone(0)  # then it is reaped: nothing more to do
    assert unacked(parent, 1) == 3
    conns = [take(parent.ends[1]) for _ in range(3)]
    for n, client in enumerate(parent.clients):
        client.sendall(f"client {n}".encode())
    # Every client is served, and by one worker only: the one worker 0 took is not handed
    # again (its answer was read before its channel's end).
    seen = sorted(conn.recv(64).decode() for conn in (first, *conns))
    assert seen == [f"client {n}" for n in range(4)]
    for conn in (first, *conns):
        conn.close()


def test_what_a_worker_said_before_it_died_counts(parent: Parent) -> None:
    parent.connect(2)
    for _ in range(2):
        parent.turn()
    first = take(parent.ends[0])
    parent.ends[0].close()  # its answer and its end are both unread by the parent
    parent.dispatch.gone(0)
    assert unacked(parent, 1) == 1  # only the other one was handed again
    other = take(parent.ends[1])
    first.close()
    other.close()


def test_a_connection_a_worker_cannot_take_goes_to_another(parent: Parent) -> None:
    parent.connect(1)
    parent.turn()
    take(parent.ends[0], say=REFUSED).close()  # out of descriptors there: dropped
    parent.turn()
    assert unacked(parent, 1) == 1
    conn = take(parent.ends[1])
    parent.clients[0].sendall(b"hello")
    assert conn.recv(8) == b"hello"
    conn.close()
    # Worker 0 gets nothing for a while.
    parent.connect(1)
    parent.turn()
    assert unacked(parent, 0) == 0 and unacked(parent, 1) == 1


def test_out_of_descriptors_the_parent_pauses_instead_of_spinning(
    parent: Parent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = parent.listening

    class Exhausted:
        def fileno(self) -> int:
            return real.fileno()

        def accept(self) -> tuple[socket.socket, object]:
            raise OSError(errno.EMFILE, "Too many open files")

    parent.dispatch.listening = Exhausted()  # type: ignore[assignment]
    parent.connect(1)
    now = time.monotonic()
    parent.dispatch.handle([real.fileno()], now)
    assert "cannot accept a connection now" in caplog.text
    # Not watched (no spin) until the pause is over, and the loop is told when that is.
    assert real.fileno() not in parent.dispatch.watched(now)
    assert parent.dispatch.wake_at(now) == pytest.approx(now + handed.ACCEPT_PAUSE)
    later = now + handed.ACCEPT_PAUSE
    assert real.fileno() in parent.dispatch.watched(later)
    # A pause that has ended asks for no wake-up: a time in the past would make the loop spin.
    assert parent.dispatch.wake_at(later + 0.01) is None
    parent.dispatch.listening = real


def test_a_refusal_that_has_ended_asks_for_no_wake_up(parent: Parent) -> None:
    parent.connect(1)
    parent.turn()
    take(parent.ends[0], say=REFUSED).close()
    parent.turn()  # to worker 1; worker 0 refused for a while
    now = time.monotonic()
    for w in parent.dispatch._workers.values():
        w.ready = False  # both restarting: what comes now waits in the parent
    parent.dispatch._waiting.append(parent.connect(1)[0])
    assert parent.dispatch.wake_at(now) == pytest.approx(now + handed.REFUSED_PAUSE, abs=0.5)
    assert parent.dispatch.wake_at(now + handed.REFUSED_PAUSE + 1) is None


def test_a_worker_short_of_kernel_memory_is_tried_again_not_dropped(
    parent: Parent, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_send = socket.send_fds
    failures = [OSError(errno.ENOBUFS, "No buffer space available")]

    def send_fds(sock: socket.socket, buffers: list[bytes], fds: list[int]) -> int:
        if failures:
            raise failures.pop()
        return real_send(sock, buffers, fds)

    monkeypatch.setattr(socket, "send_fds", send_fds)
    parent.connect(1)
    parent.turn()  # worker 0 could not be sent it: worker 1 gets it, worker 0 stays ready
    assert (unacked(parent, 0), unacked(parent, 1)) == (0, 1)
    assert parent.dispatch._workers[0].ready
    take(parent.ends[1]).close()


def test_forget_closes_what_a_forked_worker_inherited(parent: Parent) -> None:
    parent.connect(2)
    for _ in range(2):
        parent.turn()
    held = [conn for w in parent.dispatch._workers.values() for conn in w.unacked]
    channels = [w.channel for w in parent.dispatch._workers.values()]
    assert len(held) == 2
    parent.dispatch.forget()
    assert all(sock.fileno() == -1 for sock in (*held, *channels, parent.listening))


def test_stop_closes_the_port_and_what_waits(parent: Parent) -> None:
    address = parent.listening.getsockname()
    parent.dispatch.stop()
    assert parent.listening.fileno() == -1
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()


class Echo(asyncio.Protocol):
    made: ClassVar[list[Echo]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        Echo.made.append(self)

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"echo " + data)


async def test_a_worker_serves_what_it_is_handed_and_says_so(listening: socket.socket) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    loop = asyncio.get_running_loop()
    listening.setblocking(False)
    worker = Handed(loop, theirs, Echo)
    worker.start()
    client_r, client_w = await asyncio.open_connection(*listening.getsockname()[:2])
    try:
        conn, _ = await loop.sock_accept(listening)
        with conn:
            socket.send_fds(ours, [b"c"], [conn.fileno()])
        ours.settimeout(5)
        assert await asyncio.to_thread(ours.recv, 16) == TOOK
        client_w.write(b"hello")
        assert await asyncio.wait_for(client_r.read(64), 5) == b"echo hello"
        # A received descriptor is not inherited by what the worker starts (a tool's process).
        served = Echo.made[-1].transport.get_extra_info("socket")
        assert not os.get_inheritable(served.fileno())
        # A message that came without its descriptor (none left here) is said refused, and
        # never as an empty message, which the parent would read as this worker's end.
        ours.send(b"c")
        assert await asyncio.to_thread(ours.recv, 16) == REFUSED
        # With no room on the channel for its answer, the worker keeps it and says it when
        # there is room: unsaid, the parent would keep the connection and the worker lose a
        # slot for good.
        filled = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                theirs.send(b"x")
                filled += 1
        _, second_w = await asyncio.open_connection(*listening.getsockname()[:2])
        conn2, _ = await loop.sock_accept(listening)
        with conn2:
            socket.send_fds(ours, [b"c"], [conn2.fileno()])
        heard = b""
        while len(heard) < filled + 1:
            heard += await asyncio.to_thread(ours.recv, 4096)
        assert heard == b"x" * filled + TOOK
        second_w.close()
        worker.close()
        await worker.wait_closed()
    finally:
        client_w.close()
        ours.close()
        theirs.close()
