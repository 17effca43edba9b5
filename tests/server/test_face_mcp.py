"""The MCP face, driven by the real ``mcp`` client against a real ``tether serve``.

Both protocol eras the SDK speaks are exercised: ``mode="auto"`` settles on 2026-07-28 (one
self-contained POST per request; cancelling closes the response stream) and ``mode="legacy"``
on the ``initialize`` handshake (2025-11-25; cancelling posts ``notifications/cancelled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import INVALID_PARAMS, CallToolResult

from tests.server.cli_keys import create_key
from tests.server.conftest import Server, ServerFactory
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

ERAS = {"auto": "2026-07-28", "legacy": "2025-11-25"}


@asynccontextmanager
async def mcp_client(
    server: Server, mode: str = "auto", key: str | None = None
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # httpx2 is the SDK's own HTTP client: it carries the caller's key on every request.
    async with (
        httpx2.AsyncClient(headers=headers, timeout=30) as http,
        Client(streamable_http_client(server.url + "/mcp", http_client=http), mode=mode) as c,
    ):
        assert c.protocol_version == ERAS[mode]
        yield c


def begin(server: Server, session: str, agent: str, key: str | None = None) -> None:
    with server.client(key) as c:
        r = c.post("/v1/sessions", json={"session_id": session, "agent": agent})
        assert r.status_code == 201, r.text


def text(result: CallToolResult) -> str:
    first = result.content[0]
    assert first.type == "text"
    return first.text


def data(result: CallToolResult) -> dict[str, Any]:
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def turns(server: Server, session: str, key: str | None = None) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as c:
        r = await c.get(f"/v1/sessions/{session}/turns")
        assert r.status_code == 200, r.text
        found: list[dict[str, Any]] = r.json()["data"]
        return found


async def answer(server: Server, session: str, turn_id: str, call_id: str, said: str) -> None:
    """Answer a turn's question through tether's own API, as the tool error says to."""
    async with httpx.AsyncClient(base_url=server.url) as h:
        r = await h.post(
            f"/v1/sessions/{session}/turns/{turn_id}/decisions",
            json={"call_id": call_id, "answer": said},
        )
        assert r.status_code == 200, r.text


async def until_status(
    server: Server, session: str, *statuses: str, key: str | None = None
) -> dict[str, Any]:
    """The session's last turn once it is in one of ``statuses`` (polled, bounded)."""
    for _ in range(1000):
        found = await turns(server, session, key)
        if found and found[-1]["status"] in statuses:
            return found[-1]
        await asyncio.sleep(0.01)
    raise AssertionError(f"the turn of {session} never got {statuses}: {found}")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_each_agent_is_a_tool(server: Server, mode: str) -> None:
    with server.client() as c:
        agents = [a["name"] for a in c.get("/v1/agents").json()["data"]]
    async with mcp_client(server, mode) as c:
        tools = (await c.list_tools()).tools
    assert [t.name for t in tools] == agents
    echo = tools[0]
    assert echo.description == "Replies with the user messages it saw."
    assert echo.input_schema["required"] == ["message"]
    assert set(echo.input_schema["properties"]) == {"message", "session_id"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_returned_session_id_continues_the_conversation(
    server: Server, mode: str
) -> None:
    async with mcp_client(server, mode) as c:
        first = await c.call_tool("echo", {"message": "one"})
        assert not first.is_error and text(first) == "saw [] then one"
        sid = data(first)["session_id"]
        assert data(first)["status"] == "completed" and data(first)["reply"] == "saw [] then one"
        # The text says it too: hosts often show the model the text alone.
        assert sid in first.content[1].text  # type: ignore[union-attr]
        second = await c.call_tool("echo", {"message": "two", "session_id": sid})
        assert text(second) == "saw [one] then two"
        assert data(second)["session_id"] == sid
        assert data(second)["turn_id"] != data(first)["turn_id"]
        # No session_id: a new conversation each time.
        fresh = await c.call_tool("echo", {"message": "three"})
        assert text(fresh) == "saw [] then three" and data(fresh)["session_id"] != sid
    # The same conversation, through tether's own API.
    assert [t["input"] for t in await turns(server, sid)] == ["one", "two"]


async def test_the_plain_client_session_works_too(server: Server) -> None:
    """``streamable_http_client`` and ``ClientSession`` by hand, as most hosts are written."""
    async with (
        streamable_http_client(server.url + "/mcp") as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("echo", {"message": "by hand"})
        assert text(result) == "saw [] then by hand"


async def test_an_unknown_session_is_a_tool_error_and_makes_nothing(server: Server) -> None:
    async with mcp_client(server) as c:
        result = await c.call_tool("echo", {"message": "hi", "session_id": "never-made"})
    assert result.is_error
    assert data(result)["code"] == "session_not_found"
    assert "omit session_id" in text(result)
    with server.client() as h:
        assert h.get("/v1/sessions/never-made").status_code == 404


async def test_bad_arguments_and_unknown_tools(server: Server) -> None:
    async with mcp_client(server) as c:
        bad = await c.call_tool("echo", {"session_id": "x"})
        assert bad.is_error and data(bad)["code"] == "invalid_arguments"
        odd = await c.call_tool("echo", {"message": "hi", "session_id": "not an id!"})
        assert odd.is_error and data(odd)["code"] == "invalid_arguments"
        with pytest.raises(MCPError) as caught:
            await c.call_tool("nobody", {"message": "hi"})
        assert caught.value.error.code == INVALID_PARAMS


async def test_another_users_session_is_not_found_and_keys_are_required(
    make_server: ServerFactory,
) -> None:
    srv = make_server()
    alice = create_key(srv.data_dir, "alice")
    bob = create_key(srv.data_dir, "bob")
    await _until_keys_count(srv)
    async with mcp_client(srv, key=alice.secret) as a:
        mine = await a.call_tool("echo", {"message": "alice here"})
        sid = data(mine)["session_id"]
    async with mcp_client(srv, key=bob.secret) as b:
        theirs = await b.call_tool("echo", {"message": "bob here", "session_id": sid})
        assert theirs.is_error and data(theirs)["code"] == "session_not_found"
        assert "alice" not in str(theirs.structured_content)
    async with mcp_client(srv, key=alice.secret) as a:
        again = await a.call_tool("echo", {"message": "again", "session_id": sid})
        assert text(again) == "saw [alice here] then again"
    # No key, or a key nobody made: refused before the SDK, with the HTTP status.
    for headers in ({}, {"Authorization": "Bearer tk_00000000_not-a-real-key-at-all-000000"}):
        async with httpx.AsyncClient() as h:
            r = await h.post(srv.url + "/mcp", json=_LIST, headers={**_ACCEPT, **headers})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["jsonrpc"] == "2.0" and r.json()["error"]["message"]
    # The SDK's task groups wrap what the server said.
    with pytest.raises(ExceptionGroup) as refused:
        async with mcp_client(srv):
            pass
    assert refused.group_contains(MCPError, match="an API key is required")


_ACCEPT = {"Accept": "application/json, text/event-stream"}
_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


async def _until_keys_count(srv: Server) -> None:
    """The server caches "do keys exist" for a second."""
    async with httpx.AsyncClient() as h:
        for _ in range(300):
            r = await h.post(srv.url + "/mcp", json=_LIST, headers=_ACCEPT)
            if r.status_code == 401:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("the server never asked for a key")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancelling_a_call_cancels_its_turn(server: Server, mode: str) -> None:
    session = f"mcp-cancel-{mode}"
    begin(server, session, "slow")
    async with mcp_client(server, mode) as c:
        call = asyncio.create_task(c.call_tool("slow", {"message": "go", "session_id": session}))
        await until_status(server, session, "running")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        ended = await until_status(server, session, "cancelled", "completed")
    assert (ended["status"], ended["reason"]) == ("cancelled", "caller_cancelled")


async def test_a_cancel_for_another_callers_request_id_cancels_nothing(
    make_server: ServerFactory,
) -> None:
    """Handshake-era request ids are only unique per client: a cancel names the caller's own."""
    srv = make_server()
    alice = create_key(srv.data_dir, "alice")
    bob = create_key(srv.data_dir, "bob")
    await _until_keys_count(srv)
    begin(srv, "alice-slow", "slow", key=alice.secret)
    legacy = {**_ACCEPT, "MCP-Protocol-Version": "2025-11-25"}
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "slow", "arguments": {"message": "go", "session_id": "alice-slow"}},
    }
    async with httpx.AsyncClient(base_url=srv.url, headers=legacy, timeout=30) as h:
        as_alice = {"Authorization": f"Bearer {alice.secret}"}
        answer = asyncio.create_task(h.post("/mcp", json=call, headers=as_alice))
        await until_status(srv, "alice-slow", "running", key=alice.secret)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
        r = await h.post("/mcp", json=cancel, headers={"Authorization": f"Bearer {bob.secret}"})
        assert r.status_code == 202
        # Bob's cancel was applied (or not) before his 202: the turn runs to its end.
        done = await answer
    assert done.status_code == 200 and "w39" in done.text
    last = (await turns(srv, "alice-slow", alice.secret))[-1]
    assert last["status"] == "completed"


async def test_a_failed_model_is_an_error_result(
    server: Server, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    async with mcp_client(server) as c:
        failed = await c.call_tool("upstream", {"message": "doomed"})
        assert failed.is_error
        assert data(failed)["code"] == "model_error" and data(failed)["status"] == "failed"
        assert "reply" not in data(failed)
        assert "upstream melted" not in str(failed.model_dump())
        sid = data(failed)["session_id"]
        ok = await c.call_tool("upstream", {"message": "again", "session_id": sid})
        assert not ok.is_error and text(ok) == "fine now"


async def test_a_turn_awaiting_a_decision_says_how_to_decide_it(server: Server) -> None:
    async with mcp_client(server) as c:
        result = await c.call_tool("asker", {"message": "hello"})
    assert result.is_error
    waiting = data(result)
    assert waiting["code"] == "awaiting_input" and waiting["status"] == "awaiting_input"
    (decision,) = waiting["decisions"]
    assert decision["payload"]["question"] == "What is your name?"
    sid, tid = waiting["session_id"], waiting["turn_id"]
    assert f"POST /v1/sessions/{sid}/turns/{tid}/decisions" in text(result)
    # What the text says works: decide through tether's API, follow the turn to its reply.
    await answer(server, sid, tid, decision["call_id"], "Ada")
    turn = await until_status(server, sid, "completed", "failed")
    assert turn["id"] == tid and turn["output"] == "noted: The user answered: Ada"


async def test_a_message_behind_a_turn_awaiting_a_decision_is_withdrawn_not_queued(
    server: Server,
) -> None:
    # A tool error must mean nothing was done: a host (or its model) calls again. Before, the
    # message stayed queued behind the waiting turn, and it and every retry ran once the
    # decision was made.
    async with mcp_client(server) as c:
        first = await c.call_tool("asker", {"message": "hello"})
        sid, waiting_id = data(first)["session_id"], data(first)["turn_id"]
        second = await c.call_tool("asker", {"message": "second", "session_id": sid})
    assert second.is_error
    withdrawn = data(second)
    assert withdrawn["code"] == "awaiting_input" and withdrawn["status"] == "cancelled"
    assert withdrawn["behind"] == waiting_id and withdrawn["turn_id"] != waiting_id
    assert "was not sent" in text(second)
    (decision,) = withdrawn["decisions"]
    assert f"POST /v1/sessions/{sid}/turns/{waiting_id}/decisions" in text(second)
    await answer(server, sid, waiting_id, decision["call_id"], "Ada")
    await until_status(server, sid, "completed", "failed", "cancelled")
    await asyncio.sleep(0.3)  # time for a turn left queued behind it to start, were there one
    found = await turns(server, sid)
    assert [(t["input"], t["status"]) for t in found] == [
        ("hello", "completed"),
        ("second", "cancelled"),
    ]


async def test_the_face_can_be_switched_off(make_server: ServerFactory) -> None:
    srv = make_server(env={"TETHER_FACES_MCP": "off"})
    with srv.client() as c:
        assert c.post("/mcp", json=_LIST, headers=_ACCEPT).status_code == 404
        assert c.get("/v1/agents").status_code == 200
