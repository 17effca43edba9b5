"""A lean fake OpenAI model for the load benchmarks: the same answers on the wire, little CPU.

    .venv/bin/python bench/fake_model.py --latency-ms 50      # prints "listening on <url>/v1"

The benchmarks run the load generator, the server under test and the model on the same two
cores, so every millisecond of CPU the fake model spends on an answer is taken from the server
being measured (a real model runs elsewhere). ``tether.testing.fake_openai`` is built for
tests (Starlette on uvicorn, every request recorded, scripts, tool calls, errors) and costs
~1.5 ms of CPU an answer here; this one answers the benchmark's one question shape in a
fraction of that: ``asyncio`` protocols on uvloop, ``httptools`` for the request, ``orjson``
for the body, and the answer's chunks built from bytes made once at start.

What a client sees is what the test fake sends for a text reply: the status line, then
``chat.completion.chunk`` objects as server-sent events in HTTP/1.1 chunked encoding — the
role chunk, one chunk per word (each piece with its leading space), the finish chunk, the
usage chunk when ``stream_options.include_usage`` asks for it, ``data: [DONE]`` — each event
its own write (``TCP_NODELAY``), after ``latency`` ms. ``stream: false`` gets the
``chat.completion`` object.

Bench endpoints: ``POST /bench/latency {"ms"}`` sets the latency of the answers that follow;
``GET /bench/inflight`` tells how many chat requests are in flight (from the request's arrival
to the last byte of its answer) and the most since the last ``POST /bench/inflight``, which
starts a new count.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import re
import socket
import time
from typing import Any, cast

import httptools
import orjson

DEFAULT_MODEL = "fake-model"
_STATUS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed"}


def _pieces(text: str) -> list[str]:
    """Word-sized pieces with their leading whitespace, as the test fake streams them."""
    return re.findall(r"\s*\S+|\s+", text)


def _event(data: bytes) -> bytes:
    """One server-sent event as one HTTP/1.1 chunk."""
    frame = b"data: " + data + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(frame), frame)


class FakeModel:
    """The answers and the bench's counters; one per process, shared by every connection."""

    def __init__(self, reply: str, latency_ms: float) -> None:
        self.latency_ms = latency_ms
        self.in_flight = self.peak = self.served = 0
        self.pieces = [orjson.dumps(p) for p in _pieces(reply)]
        self.reply = reply
        self.ids = itertools.count(1)

    def chunks(self, model: bytes, prompt_tokens: int, include_usage: bool) -> list[bytes]:
        """The streamed answer's HTTP chunks, the last one included."""
        head = b'{"id":"chatcmpl-fake-%d","object":"chat.completion.chunk","created":%d,' % (
            next(self.ids),
            int(time.time()),
        )
        head += b'"model":' + model + b',"system_fingerprint":null,"choices":[{"index":0,'
        tail = b',"usage":null}' if include_usage else b"}"
        out = [
            _event(
                head + b'"delta":{"role":"assistant","content":""},"logprobs":null,'
                b'"finish_reason":null}]' + tail
            )
        ]
        for piece in self.pieces:
            out.append(
                _event(
                    head + b'"delta":{"content":' + piece + b'},"logprobs":null,'
                    b'"finish_reason":null}]' + tail
                )
            )
        out.append(_event(head + b'"delta":{},"logprobs":null,"finish_reason":"stop"}]' + tail))
        if include_usage:
            n = len(self.pieces)
            usage = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (
                prompt_tokens,
                n,
                prompt_tokens + n,
            )
            # The usage chunk has no choices: the head up to '"choices":[' and an empty list.
            out.append(
                _event(head.split(b'"choices":[', 1)[0] + b'"choices":[],"usage":' + usage + b"}")
            )
        out.append(_event(b"[DONE]"))
        out.append(b"0\r\n\r\n")
        return out

    def completion(self, model: bytes, prompt_tokens: int) -> bytes:
        n = len(self.pieces)
        return orjson.dumps(
            {
                "id": f"chatcmpl-fake-{next(self.ids)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": orjson.loads(model),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.reply, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                },
            }
        )


class Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 requests one after the other (keep-alive)."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.task: asyncio.Task[None] | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._respond(400, b'{"error":{"message":"bad request"}}', keep_alive=False)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()  # an answer waiting out its latency: nobody to send it to
        self.transport = None

    # -- httptools callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        keep = self.parser.should_keep_alive()
        if path == b"/v1/chat/completions" and method == b"POST":
            self.task = asyncio.ensure_future(self._chat(b"".join(self.body), keep))
        elif path == b"/bench/inflight":
            m = self.model
            if method == b"POST":
                m.peak = m.in_flight
            counts = {"now": m.in_flight, "peak": m.peak, "served": m.served}
            self._respond(200, orjson.dumps(counts), keep_alive=keep)
        elif path == b"/bench/latency" and method == b"POST":
            self.model.latency_ms = float(orjson.loads(b"".join(self.body))["ms"])
            self._respond(200, orjson.dumps({"latency_ms": self.model.latency_ms}), keep)
        elif path == b"/v1/models":
            entry = {"id": DEFAULT_MODEL, "object": "model", "created": 0, "owned_by": "tether"}
            self._respond(200, orjson.dumps({"object": "list", "data": [entry]}), keep)
        else:
            self._respond(404, b'{"error":{"message":"not found"}}', keep_alive=keep)

    # -- answers ---------------------------------------------------------------------------------
    def _respond(self, status: int, body: bytes, keep_alive: bool) -> None:
        if self.transport is None:
            return
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
            status,
            _STATUS.get(status, b"Error"),
            len(body),
        )
        self.transport.write(
            head + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n") + body
        )
        if not keep_alive:
            self.transport.close()

    async def _chat(self, raw: bytes, keep_alive: bool) -> None:
        m = self.model
        m.in_flight += 1
        m.peak = max(m.peak, m.in_flight)
        m.served += 1
        try:
            try:
                body: Any = orjson.loads(raw)
                messages = body["messages"]
                prompt_tokens = sum(len(str(x.get("content") or "").split()) for x in messages)
            except (ValueError, KeyError, TypeError, AttributeError):
                self._respond(400, b'{"error":{"message":"bad request"}}', keep_alive)
                return
            if m.latency_ms > 0:
                await asyncio.sleep(m.latency_ms / 1000)
            transport = self.transport
            if transport is None:
                return
            model = orjson.dumps(str(body.get("model") or DEFAULT_MODEL))
            if not body.get("stream"):
                self._respond(200, m.completion(model, prompt_tokens), keep_alive)
                return
            options = body.get("stream_options")
            usage = isinstance(options, dict) and bool(options.get("include_usage"))
            transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache"
                b"\r\ntransfer-encoding: chunked\r\n"
                + (b"\r\n" if keep_alive else b"connection: close\r\n\r\n")
            )
            for chunk in m.chunks(model, prompt_tokens, usage):
                transport.write(chunk)  # one write an event, as a model streams them
            if not keep_alive:
                transport.close()
        finally:
            m.in_flight -= 1
            self.task = None


async def serve(latency_ms: float, reply: str, host: str, port: int) -> None:
    model = FakeModel(reply, latency_ms)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Linux copies TCP_NODELAY to the accepted sockets: each event leaves at once, as from a
    # model streaming tokens (Nagle would hold a chunk for the ACK of the one before).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    server = await asyncio.get_running_loop().create_server(lambda: Connection(model), sock=sock)
    print(f"listening on http://{host}:{sock.getsockname()[1]}/v1", flush=True)
    async with server:
        await server.serve_forever()


def main(reply: str | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--reply", default=reply or "A fake answer.")
    args = parser.parse_args()
    loop_factory = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop_factory = uvloop.new_event_loop
    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=loop_factory) as r:
        r.run(serve(args.latency_ms, args.reply, args.host, args.port))


if __name__ == "__main__":
    main()
