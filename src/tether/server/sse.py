"""Server-sent events: ``id: <turn>:<seq>``, ``event: <type>``, ``data: <json>``.

The id names the turn and the event's per-turn ``seq``, so a client that reconnects with
``Last-Event-ID`` resumes right after the last event it received — no gap, no duplicate.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from starlette.types import Message, Send

from tether.errors import InvalidInput
from tether.records import Event

PING_SECONDS = 3.0
"""An idle event stream gets a comment line this often. Proxies close a stream idle for a
minute or so, and HTTP clients give up sooner: httpx's default read timeout is 5 s, and it is
the client of the MCP and A2A SDKs, whose examples use it as it comes. A model that thinks for
longer than that before its first token must not cost the caller its turn."""
PING = b": ping\n\n"
MAX_SEQ = 2**63 - 1
"""The largest seq a cursor may name: beyond it no stored integer exists (SQLite, PostgreSQL)."""
LAST_EVENT_ID = r"^([ \t]*[A-Za-z0-9_-]{1,64}:[0-9]{1,18}[ \t]*)?$"
"""What ``Last-Event-ID`` looks like, as documented (empty: none; 18 digits: always within
:data:`MAX_SEQ`, though :func:`resume_point` takes 19 up to it). That its turn is the path's,
no schema can say."""


def frame(event: Event) -> bytes:
    data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event.turn_id}:{event.seq}\nevent: {event.type}\ndata: {data}\n\n".encode()


def resume_point(turn_id: str, last_event_id: str | None, after: int | None) -> int:
    """The seq to resume after, from ``Last-Event-ID`` (``<turn>:<seq>``) or ``?after=``."""
    if last_event_id:
        tid, sep, seq = last_event_id.strip().rpartition(":")
        # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
        if not sep or tid != turn_id or not (seq.isascii() and seq.isdigit()):
            raise InvalidInput("Last-Event-ID must be '<turn id>:<seq>' of this turn")
        if len(seq) > 19 or int(seq) > MAX_SEQ:
            raise InvalidInput(f"the seq of Last-Event-ID must be at most {MAX_SEQ}")
        return int(seq)
    return after or 0


T = TypeVar("T")


def stream(events: AsyncIterator[Event], ping: float = PING_SECONDS) -> AsyncIterator[bytes]:
    """tether's frames of ``events``, with a comment line every ``ping`` idle seconds."""
    return encoded(events, frame, ping)


async def encoded(
    items: AsyncIterator[T], encode: Callable[[T], bytes], ping: float = PING_SECONDS
) -> AsyncIterator[bytes]:
    """``encode`` of each of ``items`` (a face's own frames), with a comment line every
    ``ping`` idle seconds, so proxies keep an idle stream open."""
    async for item in pinged(items, ping):
        yield PING if item is None else encode(item)


async def pinged(items: AsyncIterator[T], seconds: float) -> AsyncIterator[T | None]:
    """``items``, with None after every ``seconds`` without one (the caller's ping); closing
    this closes ``items``."""
    iterator = aiter(items)
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            pending = asyncio.ensure_future(anext(iterator))
            while True:
                done, _ = await asyncio.wait({pending}, timeout=seconds)
                if done:
                    break
                yield None
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        if pending is not None:
            # The client left while we waited for the next item: stop that wait before
            # closing the generator it is running.
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


class KeepAlive:
    """An ASGI ``send`` for a response made elsewhere (an SDK's): once that response is an event
    stream, :data:`PING` goes out whenever it has sent nothing for ``every`` seconds, until its
    body ends. Run :meth:`pinging` beside the response, and hand the response :meth:`send`."""

    def __init__(self, send: Send, every: float = PING_SECONDS) -> None:
        self._send = send
        self._every = every
        self._lock = asyncio.Lock()  # a ping never lands inside another send
        self._last = time.monotonic()
        self._streaming = False
        self._ended = False

    async def send(self, message: Message) -> None:
        async with self._lock:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
                self._streaming = kind == b"text/event-stream"
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                self._ended = True
            self._last = time.monotonic()
            await self._send(message)

    async def pinging(self) -> None:
        """Ping while the stream is idle, until it ends (or the client is gone: a send fails)."""
        while not self._ended:
            await asyncio.sleep(max(self._last + self._every - time.monotonic(), 0.05))
            async with self._lock:
                idle = time.monotonic() - self._last >= self._every
                if self._ended or not self._streaming or not idle:
                    continue
                ping: Message = {"type": "http.response.body", "body": PING, "more_body": True}
                try:
                    await self._send(ping)
                except Exception:  # the client went away: the response finds out for itself
                    return
                self._last = time.monotonic()
