"""One write to the socket for what a connection sends in one turn of the event loop.

uvicorn writes a response's status line and headers as soon as the app starts the response,
and its body when the app sends it: two ``send`` system calls for every plain JSON answer, and
two wake-ups of the client, which reads the head, then waits for the body. On loopback the
sending call also does the receiving side's work, so each costs the server ~0.1 ms (measured on
this 2-core host, bench/README.md). Here the writes of one turn of the event loop go out
together at its end: an answer is one ``send``, and a streamed response's events that come
together are too. Nothing waits longer than the rest of the current turn of the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

FLUSH_AT = 65_536
"""Bytes gathered past which they go at once: the inner transport's flow control (which pauses
an app that writes faster than the client reads) sees them as it did without this."""


class Coalescing(asyncio.Transport):
    """A transport that gathers ``write`` calls and hands them on once, at the end of the
    event loop's current turn (``call_soon``), or at once past :data:`FLUSH_AT` bytes; all else
    goes to ``inner``, ``close`` and ``write_eof`` after what is gathered."""

    __slots__ = ("_inner", "_loop", "_pending", "_size")

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= FLUSH_AT:
            self.flush()  # the call_soon above finds nothing left to write

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending, self._size = [], 0
        if self._inner.is_closing():
            return  # the peer is gone, or the connection was aborted: as a write would do
        self._inner.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._inner.close()

    def write_eof(self) -> None:
        self.flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def abort(self) -> None:
        self._pending, self._size = [], 0
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._inner.get_write_buffer_size() + self._size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)
