"""A remote Session against a real server: continuity, headers, and transport errors as builtins,
from the blocking and the async methods."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.cli_keys import create_key
from tests.server.conftest import Server, ServerFactory, free_port, start_server
from tether import Session
from tether.errors import AgentNotFound, InvalidInput, RemoteError, RemoteUnauthorized


@pytest.mark.slow
def test_remote_session_continues_and_maps_transport_errors(make_server: ServerFactory) -> None:
    srv: Server = make_server()
    remote = Session(agent_url=srv.url, timeout=30, agent_name="echo", session_id="remote-1")
    assert remote.chat("hi") == "saw [] then hi"
    assert remote.chat("again") == "saw [hi] then again"
    remote.close()
    slow = Session(agent_url=srv.url, timeout=0.2, agent_name="slow")
    with pytest.raises(TimeoutError):
        slow.chat("take your time")
    slow.close()
    gone = Session(agent_url=f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(ConnectionError):
        gone.chat("anyone?")
    gone.close()
    # A name the server does not serve is the exported AgentNotFound, with the known names.
    unknown = Session(agent_url=srv.url, agent_name="nope")
    with closing(unknown), pytest.raises(AgentNotFound) as refused:
        unknown.chat("hi")
    assert "echo" in refused.value.known


@pytest.mark.slow
async def test_remote_chat_async_continues_and_maps_transport_errors(server: Server) -> None:
    with closing(
        Session(agent_url=server.url, timeout=30, agent_name="echo", session_id="remote-a1")
    ) as remote:
        assert await remote.chat_async("hi") == "saw [] then hi"
        assert await remote.chat_async("again") == "saw [hi] then again"
        # The async and the blocking twin are one conversation.
        assert await asyncio.to_thread(remote.chat, "third") == "saw [hi, again] then third"
    slow = Session(agent_url=server.url, timeout=0.2, agent_name="slow")
    with closing(slow), pytest.raises(TimeoutError):
        await slow.chat_async("take your time")
    gone = Session(agent_url=f"http://127.0.0.1:{free_port()}", timeout=2)
    with closing(gone), pytest.raises(ConnectionError):
        await gone.chat_async("anyone?")


async def test_a_remote_message_that_is_not_text_is_invalid_input_before_any_request() -> None:
    # As an embedded session says it (README: "embedded or remote"): the same InvalidInput, and
    # nothing sent (nothing listens here, so a request would be a ConnectionError).
    remote = Session(agent_url=f"http://127.0.0.1:{free_port()}", timeout=2)
    with closing(remote):
        for bad in (123, None, b"bytes"):
            with pytest.raises(InvalidInput, match="text"):
                remote.chat(bad)  # type: ignore[arg-type]
            with pytest.raises(InvalidInput, match="text"):
                await remote.chat_async(bad)  # type: ignore[arg-type]


@pytest.mark.slow
def test_remote_session_sends_its_headers_sync_and_async(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = create_key(data, "erin")  # before the server starts: it needs keys from the start
    srv = start_server(data)
    sessions = ExitStack()

    def remote(**kw: Any) -> Session:
        made = Session(agent_url=srv.url, timeout=30, agent_name="echo", session_id="h-1", **kw)
        return sessions.enter_context(closing(made))

    try:
        anonymous = remote()
        with pytest.raises(RemoteError) as info:
            anonymous.chat("hi")
        assert info.value.status == 401
        # Typed as what it is, and it says what to do.
        assert isinstance(info.value, RemoteUnauthorized)
        assert "API key" in str(info.value)
        with pytest.raises(RemoteError) as info:
            asyncio.run(anonymous.chat_async("hi"))
        assert info.value.status == 401

        erin = remote(headers={"Authorization": f"Bearer {key.secret}"})
        assert erin.chat("hi") == "saw [] then hi"
        assert asyncio.run(erin.chat_async("again")) == "saw [hi] then again"
        # Any header the caller names is sent, on both paths: here the other way to give a key.
        other = remote(headers={"X-API-Key": key.secret})
        assert asyncio.run(other.chat_async("third")) == "saw [hi, again] then third"
        assert other.chat("fourth") == "saw [hi, again, third] then fourth"
        # It was erin's session all along (no other principal's would have answered).
        with srv.client(key.secret) as c:
            items = c.get("/v1/sessions/h-1/items").json()["data"]
        users = [i["content"] for i in items if i["kind"] == "user"]
        assert users == ["hi", "again", "third", "fourth"]
    finally:
        sessions.close()
        srv.stop()


@pytest.mark.slow
def test_the_remote_agent_contract(server: Server) -> None:
    """``POST /agent`` / ``/agents/{name}`` answer ``{content, session_id, metadata}``; a
    Session given such a URL talks to that agent and its reply is a str with the same keys."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        first = c.post("/agents/echo", json={"message": "hi", "session_id": "contract-1"})
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["content"] == "saw [] then hi" and body["session_id"] == "contract-1"
        meta = body["metadata"]
        assert (meta["agent_name"], meta["status"]) == ("echo", "completed")
        assert meta["turn_id"].startswith("t_") and meta["timestamp"] > 0
        again = c.post("/agents/echo", json={"message": "again", "session_id": "contract-1"})
        assert again.json()["content"] == "saw [hi] then again"
        fresh = c.post("/agent", json={"message": "hello"})  # the server's first agent
        assert fresh.status_code == 200 and fresh.json()["session_id"]
        assert fresh.json()["metadata"]["agent_name"] == "echo"
        assert c.post("/agents/nope", json={"message": "x"}).status_code == 404
    for n, url in enumerate((f"{server.url}/agents/echo", f"{server.url}/agent/")):
        with closing(Session(agent_url=url, session_id=f"contract-s{n}")) as remote:
            reply = remote.chat("one")
            assert reply == "saw [] then one" and reply["content"] == reply
            assert reply["metadata"]["agent_name"] == "echo"
            assert reply.turn is not None and reply.turn == reply["metadata"]["turn_id"]
            assert remote.chat("two")["content"] == "saw [one] then two"  # one conversation
            assert reply[0:3] == "saw"  # still a str
            later = asyncio.run(remote.chat_async("three"))  # the async twin, same agent URL
            assert later["content"] == "saw [one, two] then three"


def test_agent_urls_name_their_server_and_agent() -> None:
    from tether.session_options import server_of as _server_of

    assert _server_of("http://h:8000") == ("http://h:8000", None)
    assert _server_of("http://h:8000/") == ("http://h:8000", None)
    assert _server_of("http://h:8000/agent") == ("http://h:8000", None)
    assert _server_of("http://h:8000/agents/billing") == ("http://h:8000", "billing")
    assert _server_of("https://h/prefix/agents/tech/") == ("https://h/prefix", "tech")


def test_problem_types_map_onto_remote_errors() -> None:
    from tether import _wire
    from tether.errors import RemoteInvalidInput, RemoteLimitExceeded, RemoteTooLarge

    for kind, cls in [
        ("unauthorized", RemoteUnauthorized),
        ("too-large", RemoteTooLarge),
        ("validation", RemoteInvalidInput),
        ("limit-exceeded", RemoteLimitExceeded),
    ]:
        assert _wire.remote_error(kind) is cls and issubclass(cls, RemoteError)
        error = cls(400, f"https://tether.dev/problems/{kind}", "detail", {})
        assert (error.status, error.detail) == (400, "detail")
    assert _wire.remote_error("something-new") is RemoteError


@pytest.mark.slow
async def test_a_remote_retry_with_its_idempotency_key_gets_the_first_turn(server: Server) -> None:
    """DESIGN §4 ("``idempotency_key`` in Python"): a call that timed out is retried without
    a second turn, from the blocking and the async methods alike."""
    impatient = Session(agent_url=server.url, timeout=0.2, agent_name="slow", session_id="idem-r")
    with closing(impatient), pytest.raises(TimeoutError):
        impatient.chat("once", idempotency_key="k-1")
    with closing(
        Session(agent_url=server.url, timeout=30, agent_name="slow", session_id="idem-r")
    ) as s:
        first = await asyncio.to_thread(s.chat, "once", idempotency_key="k-1")
        again = await s.achat("once", idempotency_key="k-1")
        assert first == again and first.startswith("w0 w1")
        assert first["metadata"]["turn_id"] == again["metadata"]["turn_id"]
        other = await s.achat("twice", idempotency_key="k-2")
        assert other["metadata"]["turn_id"] != first["metadata"]["turn_id"]
    async with httpx.AsyncClient(base_url=server.url) as http:
        turns = (await http.get("/v1/sessions/idem-r/turns")).json()["data"]
    assert [t["input"] for t in turns] == ["once", "twice"]
