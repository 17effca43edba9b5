"""A remote Session against a real server: continuity, headers, and transport errors as builtins,
from the blocking and the async methods."""

from __future__ import annotations

import asyncio
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import pytest

from tests.server.cli_keys import create_key
from tests.server.conftest import Server, ServerFactory, free_port, start_server
from tether import Session
from tether.errors import AgentNotFound, RemoteError


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
