"""The fake OpenAI server itself: uvicorn on a thread of its own, a script, a request log.

The server thread has its own event loop, so sync and async tests alike can use it; everything a
test calls (``script``, ``requests``, ``reset``) takes a lock, since handlers run on that thread.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import struct
import threading
import time
from collections import deque
from types import TracebackType
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tether.testing.fake_openai._wire import (
    Answer,
    check_messages,
    error_response,
    fake_embedding,
    sse,
)
from tether.testing.fake_openai.replies import FakeError, FakeReply, ReplyFunction, echo_reply


class FakeOpenAIServer:
    """A real HTTP server on 127.0.0.1 that imitates the OpenAI API; see the package docstring.

    ``reply`` is a fixed text or a function of the request body (called on the server's thread),
    used whenever the script is empty. ``latency_ms`` is waited, without blocking other requests,
    before each response starts; ``chunk_delay_ms`` between the chunks of a streamed answer (a
    slow model: a reply that arrives word by word over seconds).
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
        chunk_delay_ms: float = 0.0,
    ) -> None:
        self.latency_ms = latency_ms
        self.chunk_delay_ms = chunk_delay_ms
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
            return error_response(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        self._record(body)
        return body

    async def _chat(self, request: Request) -> Response:
        body = await self._read_json(request)
        if isinstance(body, Response):
            return body
        problem = check_messages(body.get("messages"))
        reply: FakeReply = FakeError(400, problem) if problem else self._next_reply(body)
        if self.latency_ms > 0:
            await asyncio.sleep(self.latency_ms / 1000)
        if isinstance(reply, FakeError):
            return error_response(reply.status, reply.message)
        answer = Answer.of(reply, lambda: f"call_{next(self._ids)}")
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
            sse(
                answer.chunks(include_usage), done=not answer.cut, delay=self.chunk_delay_ms / 1000
            ),
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
            return error_response(400, "'input' must be a string or a non-empty array")
        dim = body.get("dimensions") or self.embedding_dim
        if not isinstance(dim, int) or dim < 1:
            return error_response(400, "'dimensions' must be a positive integer")
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
