"""A remote Session against a real server: continuity, and transport errors as builtins."""

from __future__ import annotations

import pytest

from tests.server.conftest import Server, ServerFactory, free_port
from tether import Session


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
