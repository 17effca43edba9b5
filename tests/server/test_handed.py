"""The parent's hand-over of connections to workers (``tether serve --workers N``), in one
process: real sockets, the supervisor's own methods, no fork.

A connection goes to the ready workers in turn; the parent keeps it until the worker says it
took it, so one handed to a worker that dies first is served by another; and a worker's
:class:`~tether.server.handed.Handed` serves what arrives with the protocol it is given."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from typing import ClassVar

import pytest

from tether.server.handed import Handed, read_acks
from tether.server.settings import Settings
from tether.server.workers import Supervisor

pytestmark = pytest.mark.skipif(
    not hasattr(socket, "send_fds"), reason="needs SCM_RIGHTS (socket.send_fds)"
)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        sock.setblocking(False)
        yield sock


@contextlib.contextmanager
def supervisor(
    listening: socket.socket, workers: int
) -> Iterator[tuple[Supervisor, list[socket.socket]]]:
    """A supervisor whose ``workers`` slots are ready, each with a channel; the workers' ends."""
    sup = Supervisor(Settings(store="memory://", workers=workers), listening, lambda *_: None)
    ends = []
    for slot in sup.slots:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        theirs.settimeout(5)
        slot.channel, slot.ready, slot.pid = ours, True, -1
        ends.append(theirs)
    try:
        yield sup, ends
    finally:
        for slot in sup.slots:
            slot.pid = 0
            sup._close_channel(slot)
        for end in ends:
            end.close()


def connect(listening: socket.socket) -> socket.socket:
    client = socket.create_connection(listening.getsockname(), timeout=5)
    return client


def take(end: socket.socket) -> socket.socket:
    """What a worker does: receive the connection, say it took it."""
    _, fds, _, _ = socket.recv_fds(end, 16, 4)
    assert len(fds) == 1, fds
    end.send(b"a")
    conn = socket.socket(fileno=fds[0])
    conn.settimeout(5)
    return conn


def has_message(end: socket.socket) -> bool:
    end.setblocking(False)
    try:
        end.recv(16, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    finally:
        end.settimeout(5)
    return True


def test_connections_go_to_the_ready_workers_in_turn(listening: socket.socket) -> None:
    with supervisor(listening, 3) as (sup, ends):
        sup.slots[1].ready = False  # starting again: nothing for it
        clients = [connect(listening) for _ in range(4)]
        sup._hand_over()
        got = [[take(ends[0]), take(ends[0])], [], [take(ends[2]), take(ends[2])]]
        assert not has_message(ends[1])
        # Each connection is the client's own: what a client writes, its worker reads.
        for n, client in enumerate(clients):
            client.sendall(f"client {n}".encode())
        seen = sorted(conn.recv(64).decode() for conns in got for conn in conns)
        assert seen == [f"client {n}" for n in range(4)]
        for conn in (c for conns in got for c in conns):
            conn.close()
        for client in clients:
            client.close()


def test_the_parent_keeps_a_connection_until_its_worker_says_it_took_it(
    listening: socket.socket,
) -> None:
    with supervisor(listening, 1) as (sup, ends):
        slot = sup.slots[0]
        client = connect(listening)
        sup._hand_over()
        assert len(slot.unacked) == 1
        kept = slot.unacked[0]
        conn = take(ends[0])
        assert slot.channel is not None
        sup._read_acks([slot.channel.fileno()])
        assert not slot.unacked and kept.fileno() == -1  # the parent's copy is closed
        # The worker's copy still serves the client.
        client.sendall(b"hi")
        assert conn.recv(8) == b"hi"
        conn.close()
        client.close()


def test_connections_a_worker_dies_before_taking_go_to_another(listening: socket.socket) -> None:
    with supervisor(listening, 2) as (sup, ends):
        first, second = sup.slots
        clients = [connect(listening) for _ in range(2)]
        sup._hand_over()  # one each
        assert len(first.unacked) == len(second.unacked) == 1
        ends[0].close()  # the first worker dies with its connection untaken
        channel = first.channel
        assert channel is not None
        sup._read_acks([channel.fileno()])
        assert first.channel is None and not first.ready and not first.unacked
        assert len(second.unacked) == 2
        conns = [take(ends[1]), take(ends[1])]
        for n, client in enumerate(clients):
            client.sendall(f"client {n}".encode())
        assert sorted(c.recv(64).decode() for c in conns) == ["client 0", "client 1"]
        # A worker found dead by the send goes the same way: the next one takes it.
        late = connect(listening)
        sup._hand_over()
        assert len(second.unacked) == 3
        take(ends[1]).close()
        for conn in conns:
            conn.close()
        for client in (*clients, late):
            client.close()


def test_a_connection_no_worker_can_take_is_closed_and_said(
    listening: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    with supervisor(listening, 1) as (sup, ends):
        ends[0].close()
        client = connect(listening)
        sup._hand_over()
        assert not sup.slots[0].unacked
        assert client.recv(8) == b""  # closed: the client is not left waiting
        assert "no worker could take a connection (1 so far)" in caplog.text
        client.close()


def test_read_acks_counts_what_the_worker_took_and_sees_it_gone() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    with ours:
        assert read_acks(ours) == 0
        theirs.send(b"aa")
        theirs.send(b"a")
        assert read_acks(ours) == 3
        theirs.close()
        assert read_acks(ours) is None


class Echo(asyncio.Protocol):
    made: ClassVar[list[Echo]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        Echo.made.append(self)

    def data_received(self, data: bytes) -> None:
        self.transport.write(b"echo " + data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's SCM_RIGHTS flags")
async def test_a_worker_serves_what_it_is_handed_and_says_so(listening: socket.socket) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    loop = asyncio.get_running_loop()
    handed = Handed(loop, theirs, Echo)
    handed.start()
    client_r, client_w = await asyncio.open_connection(*listening.getsockname()[:2])
    try:
        conn, _ = await loop.sock_accept(listening)
        with conn:
            socket.send_fds(ours, [b"c"], [conn.fileno()])
        ours.settimeout(5)
        assert await asyncio.to_thread(ours.recv, 16) == b"a"  # taken
        client_w.write(b"hello")
        assert await asyncio.wait_for(client_r.read(64), 5) == b"echo hello"
        # A received descriptor is not inherited by what the worker starts (a tool's process).
        served = Echo.made[-1].transport.get_extra_info("socket")
        assert not os.get_inheritable(served.fileno())
        handed.close()
        await handed.wait_closed()
        ours.close()  # the parent gone: nothing more is read, nothing fails
        await asyncio.sleep(0.05)
    finally:
        client_w.close()
        theirs.close()
