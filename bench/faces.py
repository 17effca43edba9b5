"""What each protocol face costs over tether's native API: one ``tether serve``, the same
zero-latency agent, the same conversation shape, every door.

Each face runs ``--turns`` turns back to back on one conversation of its own (latency), then
``--sessions`` conversations at once doing ``--turns`` each (throughput). Requests are raw HTTP
from httpx as each protocol's client would send them (no SDK overhead on the client side, which
shares the machine's cores with the server). Server CPU per turn is read from ``/proc``. Every
reply is checked: a face that answered wrongly is a failure, not a figure.

    .venv/bin/python bench/faces.py             # < 2 min on 2 cores
    .venv/bin/python bench/faces.py --quick     # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import cpu_seconds, serve

AGENT = "echo"
"""The test app's zero-latency agent: it answers ``saw [earlier user messages] then <text>``."""


@dataclass
class Conversation:
    """One conversation through one face: whatever id that face continues it by."""

    n: int
    ref: str | None = None
    said: list[str] = field(default_factory=list)


Turn = Callable[[httpx.AsyncClient, Conversation, str], Awaitable[str]]


def _sse(text: str) -> list[Any]:
    return [
        json.loads(line.removeprefix("data:").strip())
        for line in text.splitlines()
        if line.startswith("data:") and line.removeprefix("data:").strip().startswith("{")
    ]


async def _native_session(c: httpx.AsyncClient, conv: Conversation) -> str:
    if conv.ref is None:
        r = await c.post("/v1/sessions", json={"agent": AGENT})
        r.raise_for_status()
        conv.ref = str(r.json()["session_id"])
    return conv.ref


async def native(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    sid = await _native_session(c, conv)
    r = await c.post(f"/v1/sessions/{sid}/turns", json={"input": text})
    r.raise_for_status()
    return str(r.json()["output"])


async def api_chat(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    body: dict[str, Any] = {"message": text, "agent_name": AGENT}
    if conv.ref:
        body["session_id"] = conv.ref
    r = await c.post("/api/chat", json=body)
    r.raise_for_status()
    conv.ref = r.json()["session_id"]
    return str(r.json()["response"])


async def chat_completions(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    headers = {"X-Tether-Session": conv.ref} if conv.ref else {}
    body = {"model": AGENT, "messages": [{"role": "user", "content": text}]}
    r = await c.post("/v1/chat/completions", json=body, headers=headers)
    r.raise_for_status()
    conv.ref = r.headers["X-Tether-Session"]
    return str(r.json()["choices"][0]["message"]["content"])


async def chat_stream(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    headers = {"X-Tether-Session": conv.ref} if conv.ref else {}
    body = {"model": AGENT, "messages": [{"role": "user", "content": text}], "stream": True}
    r = await c.post("/v1/chat/completions", json=body, headers=headers)
    r.raise_for_status()
    conv.ref = r.headers["X-Tether-Session"]
    chunks = _sse(r.text)
    return "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])


async def responses(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    body: dict[str, Any] = {"model": AGENT, "input": text}
    if conv.ref:
        body["previous_response_id"] = conv.ref
    r = await c.post("/v1/responses", json=body)
    r.raise_for_status()
    out = r.json()
    conv.ref = out["id"]
    return str(out["output"][0]["content"][0]["text"])


async def a2a(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    message: dict[str, Any] = {
        "kind": "message",
        "role": "user",
        "parts": [{"kind": "text", "text": text}],
        "messageId": str(uuid.uuid4()),
    }
    if conv.ref:
        message["contextId"] = conv.ref
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    r = await c.post(f"/a2a/{AGENT}", json=body)
    task = r.json()["result"]
    conv.ref = task["contextId"]
    return str(task["artifacts"][0]["parts"][0]["text"])


_MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}


async def mcp(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    arguments = {"message": text, **({"session_id": conv.ref} if conv.ref else {})}
    params = {"name": AGENT, "arguments": arguments}
    body = {"jsonrpc": "2.0", "id": conv.n, "method": "tools/call", "params": params}
    r = await c.post("/mcp", json=body, headers=_MCP_HEADERS)
    r.raise_for_status()
    (answer,) = _sse(r.text)
    result = answer["result"]["structuredContent"]
    conv.ref = result["session_id"]
    return str(result["reply"])


async def langgraph(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    if conv.ref is None:
        r = await c.post("/lg/threads", json={})
        conv.ref = str(r.json()["thread_id"])
    body = {"assistant_id": AGENT, "input": {"messages": [{"role": "user", "content": text}]}}
    r = await c.post(f"/lg/threads/{conv.ref}/runs/wait", json=body)
    r.raise_for_status()
    return str(r.json()["messages"][-1]["content"])


async def agui(c: httpx.AsyncClient, conv: Conversation, text: str) -> str:
    conv.ref = conv.ref or f"thread-{uuid.uuid4().hex}"
    body = {
        "threadId": conv.ref,
        "runId": uuid.uuid4().hex,
        "messages": [{"id": uuid.uuid4().hex, "role": "user", "content": text}],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    r = await c.post(f"/agui/{AGENT}", json=body)
    r.raise_for_status()
    events = _sse(r.text)
    if events[-1]["type"] != "RUN_FINISHED":
        raise RuntimeError(f"AG-UI run ended {events[-1]}")
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


FACES: dict[str, Turn] = {
    "native /v1 turns": native,
    "/api/chat": api_chat,
    "openai chat": chat_completions,
    "openai chat stream": chat_stream,
    "openai responses": responses,
    "a2a message/send": a2a,
    "mcp tools/call": mcp,
    "langgraph runs/wait": langgraph,
    "ag-ui run (SSE)": agui,
}


def _expected(conv: Conversation, text: str) -> str:
    return f"saw [{', '.join(conv.said)}] then {text}"


async def _one(turn: Turn, c: httpx.AsyncClient, conv: Conversation, i: int) -> float:
    text = f"m{conv.n}x{i}"
    start = time.perf_counter()
    reply = await turn(c, conv, text)
    took = time.perf_counter() - start
    if reply != _expected(conv, text):
        raise RuntimeError(f"wrong reply {reply!r}, expected {_expected(conv, text)!r}")
    conv.said.append(text)
    return took


@dataclass
class Row:
    face: str
    p50_ms: float
    p99_ms: float
    turns_per_s: float
    cpu_ms: float


async def measure(url: str, pid: int, name: str, turn: Turn, turns: int, sessions: int) -> Row:
    limits = httpx.Limits(max_connections=sessions + 4)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        conv = Conversation(0)
        await _one(turn, c, conv, -1)  # warm: the session exists before timing starts
        times = [await _one(turn, c, conv, i) for i in range(turns)]
        convs = [Conversation(n + 1) for n in range(sessions)]
        cpu0, wall0 = cpu_seconds(pid), time.perf_counter()

        async def work(conv: Conversation) -> None:
            for i in range(turns):
                await _one(turn, c, conv, i)

        await asyncio.gather(*(work(cv) for cv in convs))
        wall, cpu = time.perf_counter() - wall0, cpu_seconds(pid) - cpu0
    ordered = sorted(times)
    return Row(
        name,
        statistics.median(times) * 1000,
        ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        sessions * turns / wall,
        cpu / (sessions * turns) * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40, help="turns per conversation")
    parser.add_argument("--sessions", type=int, default=16, help="conversations at once")
    parser.add_argument("--quick", action="store_true", help="8 turns, 4 conversations")
    args = parser.parse_args()
    turns, sessions = (8, 4) if args.quick else (args.turns, args.sessions)
    print(f"load average {os.getloadavg()[0]:.2f}; {turns} turns per conversation; ", end="")
    print(f"{sessions} conversations at once; agent {AGENT!r} (zero-latency scripted model)")
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp), Path(tmp) / "log") as url:
        rows = [
            asyncio.run(measure(url, url.pid, name, turn, turns, sessions))
            for name, turn in FACES.items()
        ]
    base = rows[0]
    head = f"| face | p50 ms | p99 ms | turns/s @ {sessions} | server CPU ms/turn | CPU × native |"
    print("\n" + head)
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.face} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {r.turns_per_s:.0f} | "
            f"{r.cpu_ms:.2f} | {r.cpu_ms / base.cpu_ms:.2f} |"
        )


if __name__ == "__main__":
    main()
