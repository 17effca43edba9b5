"""A connection's writes of one turn of the event loop go out as one: a JSON answer's head and
body in one ``send`` (uvicorn writes them apart), a streamed response's pieces as they come."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tether.server.coalesce import FLUSH_AT, Coalescing
from tether.server.head_limit import head_limited


class Recording(asyncio.Transport):
    """A transport that keeps what it is asked to write, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__(extra={"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 80)})
        self.writes: list[bytes] = []
        self.closed = False
        self.eof = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_turn_of_the_loop_go_out_together() -> None:
    inner = Recording()
    out = Coalescing(inner, asyncio.get_running_loop())
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out.write(b"")  # nothing to send: no write of its own
    out.write(memoryview(b"body"))
    assert inner.writes == []  # not before this turn of the loop ends
    assert out.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")
    await asyncio.sleep(0)
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    out.write(b"later")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"later"]


async def test_close_and_eof_send_what_was_gathered_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    inner = Recording()
    out = Coalescing(inner, loop)
    out.write(b"last words")
    out.close()
    assert (inner.writes, inner.closed) == ([b"last words"], True)
    await asyncio.sleep(0)
    assert inner.writes == [b"last words"]  # the pending flush finds nothing more
    out.write(b"after close")
    await asyncio.sleep(0)
    assert inner.writes == [b"last words"]  # a closed connection takes no more, as uvloop's

    inner = Recording()
    out = Coalescing(inner, loop)
    out.write(b"answer")
    out.write_eof()
    assert (inner.writes, inner.eof) == ([b"answer"], True)

    inner = Recording()
    out = Coalescing(inner, loop)
    out.write(b"never sent")
    out.abort()
    await asyncio.sleep(0)
    assert (inner.writes, inner.closed) == ([], True)


async def test_a_big_write_goes_at_once_so_flow_control_sees_it() -> None:
    inner = Recording()
    out = Coalescing(inner, asyncio.get_running_loop())
    out.write(b"x" * 10)
    out.write(b"y" * FLUSH_AT)
    assert inner.writes == [b"x" * 10 + b"y" * FLUSH_AT]
    assert out.get_write_buffer_size() == 0


async def json_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await JSONResponse({"ok": True})(scope, receive, send)


async def streaming_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await asyncio.sleep(0.05)  # an event that takes its time
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def served(app: Any, request: bytes) -> Recording:
    """``request`` through the protocol ``tether serve`` runs, over a recording transport;
    returns once the response is complete."""
    config = uvicorn.Config(app, http=head_limited(65_536), lifespan="off", log_level="error")
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=uvicorn.server.ServerState(), app_state={}
    )
    assert isinstance(protocol, HttpToolsProtocol)
    transport = Recording()
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(200):
        await asyncio.sleep(0.005)
        if protocol.cycle is not None and protocol.cycle.response_complete:
            break
    await asyncio.sleep(0)  # the end of the turn that completed it
    return transport


async def test_a_json_answer_is_one_write_head_and_body() -> None:
    transport = await served(json_app, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    assert len(transport.writes) == 1, transport.writes
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 11" in head
    assert body == b'{"ok":true}'


async def test_a_streamed_response_head_is_not_held_back_for_its_body() -> None:
    transport = await served(streaming_app, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    # The head went out on its own, 50 ms before the first event, which came with nothing else.
    assert len(transport.writes) >= 2, transport.writes
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK")
    assert transport.writes[0].endswith(b"\r\n\r\n")
    assert b"data: 1" in b"".join(transport.writes[1:])


async def test_a_connection_close_answer_is_sent_before_the_close() -> None:
    transport = await served(json_app, b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert transport.closed
    assert b"".join(transport.writes).endswith(b'{"ok":true}')
