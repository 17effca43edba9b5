"""A model that thinks before its first token costs no door its caller: every event stream a
door answers with sends a comment line while it is idle (``tether.server.sse.PING_SECONDS``),
so clients with a short read timeout (httpx's default is 5 s; the MCP and A2A SDKs' examples
use it as it comes) are still reading when the answer comes.

One real ``tether serve`` in front of a fake model that waits 6 s before it answers; each door
is driven by a client that gives up after 4.5 s without a byte.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import httpx2
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2 as pb
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.server.conftest import Server
from tether.testing.fake_openai import FakeOpenAIServer

THINKS_MS = 6000
PATIENCE = 4.5
"""Seconds a client waits for the next byte; less than the model's silence."""
REPLY = "worth the wait"


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeOpenAIServer]:
    """The model of conftest's ``server`` (its agent ``upstream``), slow to start answering."""
    with FakeOpenAIServer(latency_ms=THINKS_MS, reply=REPLY) as srv:
        yield srv


async def test_an_mcp_call_outlasts_a_clients_read_timeout_in_either_era(server: Server) -> None:
    # Before, a call's response sent nothing for 15 s (2026-07-28: not even its headers) or
    # until the end (the handshake era): the client gave up after 5 s, and at 2026-07-28 its
    # closed stream cancelled the turn.
    async def call(mode: str) -> None:
        async with (
            httpx2.AsyncClient(timeout=PATIENCE) as http,
            Client(streamable_http_client(server.url + "/mcp", http_client=http), mode=mode) as c,
        ):
            result = await c.call_tool("upstream", {"message": f"take your time ({mode})"})
        assert not result.is_error, result
        assert isinstance(result.structured_content, dict)
        assert result.structured_content["reply"] == REPLY

    await asyncio.gather(call("auto"), call("legacy"))


async def test_an_a2a_stream_outlasts_a_clients_read_timeout(server: Server) -> None:
    async with httpx.AsyncClient(timeout=PATIENCE) as http:
        client = await create_client(
            f"{server.url}/a2a/upstream", client_config=ClientConfig(httpx_client=http)
        )
        try:
            message = pb.Message(
                message_id=uuid.uuid4().hex,
                role=pb.Role.ROLE_USER,
                parts=[pb.Part(text="take your time")],
            )
            events = [e async for e in client.send_message(pb.SendMessageRequest(message=message))]
        finally:
            await client.close()
    final = events[-1].status_update.status
    assert final.state == pb.TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in final.message.parts) == REPLY


async def test_native_openai_and_agui_streams_outlast_a_clients_read_timeout(
    server: Server,
) -> None:
    run = {
        "threadId": "agui-slow",
        "runId": "run-1",
        "messages": [{"id": "m1", "role": "user", "content": "take your time"}],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    chat = {
        "model": "upstream",
        "messages": [{"role": "user", "content": "take your time"}],
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=server.url, timeout=PATIENCE) as h:
        r = await h.post("/v1/sessions", json={"session_id": "native-slow", "agent": "upstream"})
        assert r.status_code == 201, r.text
        streams = {
            "native": ("/v1/sessions/native-slow/turns", {"input": "hi", "stream": True}),
            "openai": ("/v1/chat/completions", chat),
            "agui": ("/agui/upstream", run),
        }

        async def lines(path: str, body: object) -> list[str]:
            async with h.stream("POST", path, json=body) as r:
                assert r.status_code == 200, await r.aread()
                return [line async for line in r.aiter_lines() if line]

        # At once: the model waits 6 s for each.
        read = await asyncio.gather(*(lines(path, body) for path, body in streams.values()))
        seen = dict(zip(streams, read, strict=True))
    native = seen["native"]
    assert ": ping" in native and "event: turn.ended" in native
    assert any(REPLY in line for line in native if line.startswith("data:"))
    openai = [line for line in seen["openai"] if line.startswith("data:")]
    assert ": ping" in seen["openai"] and openai[-1] == "data: [DONE]"
    assert REPLY in "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in (json.loads(line[5:]) for line in openai[:-1])
        if c["choices"]
    )
    agui = [json.loads(line[5:]) for line in seen["agui"] if line.startswith("data:")]
    assert ": ping" in seen["agui"] and agui[-1]["type"] == "RUN_FINISHED"
