"""A minimal chat server: the bar for "what Python can do here" beside ``tether serve`` (issue 15).

It does the least a conversational server must do, and nothing else: per-session history in
memory, one turn at a time per session, the completion streamed from an OpenAI-compatible
model through one shared HTTP client. No persistence, no events, no auth, no limits.

    POST /sessions                  -> {"id": "..."}
    POST /sessions/{id}/turns       {"input": "..."} -> {"output": "..."}
    GET  /healthz                   -> ok

    .venv/bin/python bench/reference_server.py --port 8100 --upstream http://127.0.0.1:9000/v1

``--upstream`` defaults to ``OPENAI_BASE_URL``. The event loop is uvloop's when it is installed,
as it is for ``tether serve`` (uvicorn picks it), so the two differ by their own work only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web


@dataclass(slots=True)
class Conversation:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    messages: list[dict[str, str]] = field(default_factory=list)


class UpstreamError(Exception):
    pass


class Reference:
    def __init__(self, upstream: str, model: str, system: str, api_key: str) -> None:
        self.url = upstream.rstrip("/") + "/chat/completions"
        self.model = model
        self.system = {"role": "system", "content": system}
        self.headers = {"authorization": f"Bearer {api_key}"}
        self.sessions: dict[str, Conversation] = {}
        self.client: ClientSession | None = None

    async def start(self, _: web.Application) -> None:
        # One client for every session; limit=0: no pool cap, each session needs a connection.
        connector = TCPConnector(limit=0, force_close=False)
        self.client = ClientSession(connector=connector, timeout=ClientTimeout(total=600))

    async def stop(self, _: web.Application) -> None:
        if self.client is not None:
            await self.client.close()

    async def create(self, _: web.Request) -> web.Response:
        sid = uuid.uuid4().hex
        self.sessions[sid] = Conversation()
        return web.json_response({"id": sid}, status=201)

    async def turn(self, request: web.Request) -> web.Response:
        conv = self.sessions.get(request.match_info["id"])
        if conv is None:
            return web.json_response({"error": "no such session"}, status=404)
        body = await request.json()
        text = body.get("input") if isinstance(body, dict) else None
        if not isinstance(text, str):
            return web.json_response({"error": "'input' must be a string"}, status=400)
        # The whole turn under the session's lock: a second message to the same session waits,
        # so history is never read by one turn while another is about to append to it.
        async with conv.lock:
            user = {"role": "user", "content": text}
            try:
                output = await self.complete([self.system, *conv.messages, user])
            except UpstreamError as exc:
                return web.json_response({"error": str(exc)}, status=502)
            conv.messages += [user, {"role": "assistant", "content": output}]
        return web.json_response({"output": output})

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """The model's answer to ``messages``, streamed (as tether asks for it) and joined."""
        assert self.client is not None
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        parts: list[str] = []
        async with self.client.post(self.url, json=payload, headers=self.headers) as r:
            if r.status != 200:
                raise UpstreamError(f"upstream answered {r.status}: {(await r.text())[:200]}")
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    break
                for choice in json.loads(data).get("choices", ()):
                    if content := choice.get("delta", {}).get("content"):
                        parts.append(content)
        return "".join(parts)


async def healthz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(ref: Reference) -> web.Application:
    app = web.Application()
    app.on_startup.append(ref.start)
    app.on_cleanup.append(ref.stop)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/sessions", ref.create)
    app.router.add_post("/sessions/{id}/turns", ref.turn)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--upstream", default=os.environ.get("OPENAI_BASE_URL"))
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--system", default="You are a helpful assistant.")
    args = parser.parse_args()
    if not args.upstream:
        parser.error("--upstream or OPENAI_BASE_URL is needed")
    ref = Reference(args.upstream, args.model, args.system, os.environ.get("OPENAI_API_KEY", "x"))
    loop: asyncio.AbstractEventLoop | None = None
    with contextlib.suppress(ImportError):
        import uvloop

        loop = uvloop.new_event_loop()
    web.run_app(
        make_app(ref), host=args.host, port=args.port, access_log=None, print=None, loop=loop
    )


if __name__ == "__main__":
    main()
