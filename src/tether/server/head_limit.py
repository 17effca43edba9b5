"""A bound on the request head (request line and headers) for the server ``tether serve`` runs.

uvicorn's httptools protocol has no such bound: llhttp hands header bytes over as they arrive
and the parser keeps appending them to one growing value, so one request with a 100 MB
``X-API-Key`` costs seconds of CPU on the event loop (stalling every other request) and
hundreds of MB. h11 has a bound (``h11_max_incomplete_event_size``) but answers 400 and parses
every request in pure Python. So tether keeps httptools and counts the bytes of each head
itself: past the bound the connection gets a 431 problem, and whatever else the client sends is
read and dropped (not parsed, not kept) for a moment so that it can read the answer instead of
a reset, then the connection is closed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tether.server.coalesce import Coalescing
from tether.server.problems import BASE, PROBLEM_JSON

# How long a refused connection is drained before it is closed: enough for a client on the
# same network to finish sending and read the 431, short enough to be no resource of note.
_LINGER_SECONDS = 2.0


def head_limited(limit: int) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol, refusing request heads over ``limit`` bytes with a 431."""

    class HeadLimitedProtocol(_HeadLimited):
        max_head_bytes = limit

    return HeadLimitedProtocol


def too_large_response(limit: int, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    body = json.dumps(
        {
            "type": BASE + "headers-too-large",
            "title": "Request header fields too large",
            "status": 431,
            "detail": f"the request line and headers are limited to {limit} bytes",
        }
    ).encode()
    lines = [b"HTTP/1.1 431 Request Header Fields Too Large"]
    lines += [name + b": " + value for name, value in default_headers]
    lines += [
        b"content-type: " + PROBLEM_JSON.encode(),
        b"content-length: " + str(len(body)).encode(),
        b"connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class _HeadTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing, uvicorn calls send_400_response."""


class _HeadLimited(HttpToolsProtocol):
    max_head_bytes = 65_536

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Bytes of the current request's head received so far; None between the end of a head
        # and the end of its message (the body is BodyLimit's business).
        self._head: int | None = 0
        # A message ended inside the chunk being fed: the next head started somewhere in it.
        self._head_restarted = False
        self._refused = False
        # The head as the parser hands it over (URL and header fields): exact, for a head that
        # arrives within one read, where the count of reads above sees nothing.
        self._parsed = 0
        self._over = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        # Everything this connection writes, answers and refusals alike, in one order: a
        # response's head and body go out in one write (:mod:`tether.server.coalesce`).
        self.transport = Coalescing(self.transport, self.loop)

    def on_message_begin(self) -> None:
        self._parsed = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def _count(self, size: int) -> None:
        self._parsed += size
        if self._parsed > self.max_head_bytes:
            self._over = True
            raise _HeadTooLarge

    def send_400_response(self, msg: str) -> None:
        if self._over:  # the parser stopped because a callback above refused the head
            self._refuse()
            return
        super().send_400_response(msg)

    def on_headers_complete(self) -> None:
        self._head = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head = 0
        self._head_restarted = True

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # draining a refused connection: read, never parse or keep
        self._head_restarted = False
        super().data_received(data)
        if self._head is None or self.transport.is_closing():
            return
        if self._head_restarted:
            # Only part of this chunk belongs to the new head, and which part is not known:
            # count from the next chunk (the bound may be passed by at most one read).
            return
        self._head += len(data)
        if self._head > self.max_head_bytes:
            self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        self.logger.warning(
            "refused a request head of over %d bytes from %s", self.max_head_bytes, self.client
        )
        if self.cycle is None or self.cycle.response_complete:
            # Otherwise the previous (pipelined) response is still being written: just close.
            self.transport.write(
                too_large_response(self.max_head_bytes, self.server_state.default_headers)
            )
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(_LINGER_SECONDS, self.transport.close)
                return
        self.transport.close()
