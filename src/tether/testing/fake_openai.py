"""A fake OpenAI-compatible HTTP server, for tests and benchmarks.

It speaks the wire format of ``/v1/chat/completions`` (streaming SSE and plain JSON),
``/v1/embeddings`` and ``/v1/models`` closely enough for the official ``openai`` SDK, and answers
deterministically: by default it echoes the last user message. Tests script what comes next
(text, tool calls, HTTP errors, cut streams) and read back every request body it received::

    with FakeOpenAIServer() as srv:
        srv.script(FakeToolCall("add", '{"a": 1}'), "done")
        model = OpenAIModel("fake", base_url=srv.base_url)
        ...
        assert srv.requests[0]["messages"][0]["role"] == "system"

The server runs uvicorn in a background thread with its own event loop, so it serves sync and
async tests alike. ``python -m tether.testing.fake_openai --port 0`` runs one as a process.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import math
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeAlias

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

__all__ = [
    "FakeCut",
    "FakeError",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeToolCall",
    "echo_reply",
]


@dataclass(frozen=True, slots=True)
class FakeToolCall:
    """Answer with a call of tool ``name``; ``arguments`` is the JSON text, streamed in pieces."""

    name: str
    arguments: str = "{}"
    id: str | None = None
    """The call id; ``None`` gives ``call_<n>`` from a per-server counter."""


@dataclass(frozen=True, slots=True)
class FakeError:
    """Answer with an OpenAI-shaped error body and HTTP ``status``.

    Scripted, it is served ``times`` times before the script moves on; returned by a reply
    function, it is served each time the function returns it.
    """

    status: int = 500
    message: str = "fake server error"
    times: int = 1


@dataclass(frozen=True, slots=True)
class FakeCut:
    """Stream ``text`` and end the response without a finish reason or ``[DONE]``.

    What a client sees when a proxy or a crashing server drops the stream mid-answer.
    """

    text: str = "partial answer"


FakeReply: TypeAlias = str | FakeToolCall | tuple[FakeToolCall, ...] | FakeError | FakeCut
"""Text, one tool call, parallel tool calls, an error, or a cut stream."""

ReplyFunction: TypeAlias = Callable[[dict[str, Any]], FakeReply]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
_JSON_SEPARATORS = (",", ":")


def echo_reply(body: dict[str, Any]) -> FakeReply:
    """The default reply: ``"echo: "`` and the content of the last user message."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return f"echo: {content}"
    return "echo:"


class FakeOpenAIServer:
    """A real HTTP server on 127.0.0.1 that imitates the OpenAI API; see the module docstring.

    ``reply`` is a fixed text or a function of the request body (called on the server's thread),
    used whenever the script is empty. ``latency_ms`` is waited, without blocking other requests,
    before each response starts.
    """

    def __init__(
        self,
        latency_ms: float = 0.0,
        reply: str | ReplyFunction = echo_reply,
        *,
        embedding_dim: int = 64,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "fake-model",
    ) -> None:
        self.latency_ms = latency_ms
        self.reply = reply
        self.embedding_dim = embedding_dim
        self.host = host
        self.model = model
        self._requested_port = port
        self._port: int | None = None
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._script: deque[list[Any]] = deque()  # [reply, remaining times]
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # -- configuration and inspection (any thread) ---------------------------------------------

    def script(self, *responses: FakeReply) -> None:
        """Queue replies for the next chat requests, in order, before ``reply`` applies again."""
        with self._lock:
            for r in responses:
                times = r.times if isinstance(r, FakeError) else 1
                self._script.append([r, max(1, times)])

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A snapshot of every request body received so far, chat and embeddings, in order."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Only the chat completion request bodies."""
        return [r for r in self.requests if "messages" in r]

    def reset(self) -> None:
        """Forget recorded requests and any unconsumed script."""
        with self._lock:
            self._requests.clear()
            self._script.clear()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeOpenAIServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the value for an OpenAI client's ``base_url``."""
        return f"http://{self.host}:{self.port}/v1"

    # -- lifecycle -------------------------------------------------------------------------------

    def _config(self) -> uvicorn.Config:
        # No lifespan, websockets, access log or logging setup: less work per request, and no
        # changes to the host process's logging configuration.
        return uvicorn.Config(
            self.app,
            lifespan="off",
            ws="none",
            http="h11",
            loop="asyncio",
            access_log=False,
            log_config=None,
            log_level="warning",
            timeout_graceful_shutdown=1,
            backlog=2048,
        )

    def _bind(self) -> socket.socket:
        # Binding here (not in uvicorn) gives the real port at once, even for port 0.
        # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted connections only when
        # the listening socket says it is TCP; without it every streamed answer waits ~40 ms
        # for a delayed ACK (Nagle), which would make the fake look slow.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        self._port = sock.getsockname()[1]
        return sock

    def start(self) -> Self:
        """Serve in a background thread; returns once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("FakeOpenAIServer is already started")
        self._socket = self._bind()
        self._server = uvicorn.Server(self._config())
        server, sock = self._server, self._socket
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="fake-openai", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("FakeOpenAIServer failed to start")
            time.sleep(0.005)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread; open streams get a second to finish."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    def serve_forever(self) -> None:
        """Serve in the calling (main) thread until SIGINT/SIGTERM."""
        self._socket = self._bind()
        self._server = uvicorn.Server(self._config())
        print(f"listening on {self.base_url}", flush=True)
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._socket.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        # Starting and stopping block briefly (thread start, join); keep that off the caller's loop.
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    # -- handlers (server thread) ----------------------------------------------------------------

    def _record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._requests.append(body)

    def _next_reply(self, body: dict[str, Any]) -> FakeReply:
        with self._lock:
            if self._script:
                entry = self._script[0]
                entry[1] -= 1
                if entry[1] <= 0:
                    self._script.popleft()
                scripted: FakeReply = entry[0]
                return scripted
        return self.reply if isinstance(self.reply, str) else self.reply(body)

    async def _read_json(self, request: Request) -> dict[str, Any] | Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        self._record(body)
        return body

    async def _chat(self, request: Request) -> Response:
        body = await self._read_json(request)
        if isinstance(body, Response):
            return body
        problem = _check_messages(body.get("messages"))
        reply: FakeReply = FakeError(400, problem) if problem else self._next_reply(body)
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        if isinstance(reply, FakeError):
            return _error(reply.status, reply.message)
        answer = _Answer.of(reply, lambda: f"call_{next(self._ids)}")
        answer.model = str(body.get("model") or self.model)
        answer.id = f"chatcmpl-fake-{next(self._ids)}"
        answer.prompt_tokens = sum(
            len(str(m.get("content") or "").split()) for m in body["messages"]
        )
        if not body.get("stream"):
            return JSONResponse(answer.completion())
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        return StreamingResponse(
            _sse(answer.chunks(include_usage), done=not answer.cut),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache"},
        )

    async def _embeddings(self, request: Request) -> Response:
        body = await self._read_json(request)
        if isinstance(body, Response):
            return body
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not inputs:
            return _error(400, "'input' must be a string or a non-empty array")
        dim = body.get("dimensions") or self.embedding_dim
        if not isinstance(dim, int) or dim < 1:
            return _error(400, "'dimensions' must be a positive integer")
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(inputs):
            vector = fake_embedding(item if isinstance(item, str) else json.dumps(item), dim)
            encoded: str | list[float] = (
                base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode() if as_base64 else vector
            )
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(len(str(x).split()) for x in inputs)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": str(body.get("model") or self.model),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _models(self, request: Request) -> Response:
        entry = {"id": self.model, "object": "model", "created": 0, "owned_by": "tether"}
        return JSONResponse({"object": "list", "data": [entry]})


def fake_embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``: SHA-256 in counter mode, mapped to [-1, 1)."""
    raw = b"".join(
        hashlib.sha256(f"{i}:{text}".encode()).digest() for i in range(math.ceil(dim * 4 / 32))
    )
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{dim}I", raw[: dim * 4])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def _check_messages(messages: Any) -> str | None:
    """The 400 a real server would give for malformed messages, or None."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in {
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        }:
            return f"messages[{i}] has no valid role"
        if m["role"] == "tool" and not m.get("tool_call_id"):
            return f"messages[{i}]: a tool message needs 'tool_call_id'"
        if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            return f"messages[{i}]: an assistant message needs 'content' or 'tool_calls'"
    return None


def _error(status: int, message: str) -> Response:
    kind = _ERROR_TYPES.get(status, "rate_limit_error" if status == 429 else "server_error")
    error = {"message": message, "type": kind, "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=status)


def _pieces(text: str) -> list[str]:
    """Word-sized pieces (each with its leading whitespace) that join back to ``text``."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass(slots=True)
class _Answer:
    """One chat answer: either text or tool calls, rendered as JSON or as stream chunks."""

    text: str | None
    calls: tuple[FakeToolCall, ...]
    cut: bool
    id: str = ""
    model: str = ""
    prompt_tokens: int = 0

    @classmethod
    def of(cls, reply: FakeReply, new_call_id: Callable[[], str]) -> _Answer:
        if isinstance(reply, FakeToolCall):
            reply = (reply,)
        if isinstance(reply, tuple):
            calls = tuple(FakeToolCall(c.name, c.arguments, c.id or new_call_id()) for c in reply)
            return cls(None, calls, cut=False)
        if isinstance(reply, FakeCut):
            return cls(reply.text, (), cut=True)
        return cls(str(reply), (), cut=False)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.calls
            ]
            finish, output = "tool_calls", sum(len(_pieces(c.arguments)) + 1 for c in self.calls)
        else:
            finish, output = "stop", len(_pieces(self.text or ""))
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": self.usage(output),
        }

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of the streamed answer, in OpenAI's order."""
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                c["usage"] = None  # OpenAI sends null usage on every chunk but the last
            return c

        out: list[dict[str, Any]] = []
        output = 0
        if self.calls:
            out.append(chunk({"role": "assistant", "content": None}))
            for index, call in enumerate(self.calls):
                head = {"index": index, "id": call.id, "type": "function"}
                out.append(
                    chunk(
                        {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
                    )
                )
                for piece in _pieces(call.arguments):
                    out.append(
                        chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                    )
                    output += 1
            finish = "tool_calls"
        else:
            out.append(chunk({"role": "assistant", "content": ""}))
            pieces = _pieces(self.text or "")
            out.extend(chunk({"content": piece}) for piece in pieces)
            output = len(pieces)
            finish = "stop"
        if self.cut:
            return out
        out.append(chunk({}, finish))
        if include_usage:
            last = chunk({})
            last["choices"] = []
            last["usage"] = self.usage(output)
            out.append(last)
        return out


async def _sse(events: list[dict[str, Any]], *, done: bool) -> AsyncIterator[bytes]:
    for event in events:
        yield b"data: " + json.dumps(event, separators=_JSON_SEPARATORS).encode() + b"\n\n"
    if done:
        yield b"data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tether.testing.fake_openai",
        description="Serve a fake OpenAI-compatible API that echoes the last user message.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before each answer")
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--reply", help="answer every chat request with this text instead")
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(
        args.latency_ms,
        args.reply if args.reply is not None else echo_reply,
        embedding_dim=args.embedding_dim,
        host=args.host,
        port=args.port,
    )
    server.serve_forever()


if __name__ == "__main__":
    main()
