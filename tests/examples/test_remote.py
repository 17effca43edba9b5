"""Sessions seed, "Remote Agents": a Session on a real ``tether serve`` — "Basic Connection",
"Send Messages", "Error Handling", the "Remote Agent Server" contract, "Remote Session Options"
(headers), and the complete example "Remote Agent Client".

Transport trouble raises the documented builtins within the timeout and a second: a server
that accepts and never answers is a ``TimeoutError``, a port nobody listens on a
``ConnectionError``, from ``chat`` and ``chat_async`` alike.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.examples.conftest import Seed, model_env_of, said
from tests.server.cli_keys import create_key
from tests.server.conftest import Server, free_port, start_server
from tether import Session
from tether.errors import RemoteUnauthorized
from tether.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.slow  # real server processes

APP = "tests.examples.apps:app"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAIServer) -> Iterator[Server]:
    """One keyless server for the module (each test its own session ids)."""
    srv = start_server(tmp_path_factory.mktemp("remote"), target=APP, env=model_env_of(fake))
    yield srv
    srv.stop()


def turns(server: Server, session_id: str) -> list[dict[str, Any]]:
    with server.client() as c:
        found: list[dict[str, Any]] = c.get(f"/v1/sessions/{session_id}/turns").json()["data"]
    return found


def test_basic_connection_and_send_messages(
    seed: Seed, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    # fmt: off
    # Connect to remote agent
    session = Session(
        agent_url=f"{server.url}/agent"
    )

    # Send message to remote agent
    response = session.chat("Hello remote agent!")

    # Response includes full context
    print(response['content'])
    print(response['metadata'])

    # fmt: on
    assert capsys.readouterr().out.splitlines()[0] == "echo: Hello remote agent!"
    meta = response["metadata"]
    assert (meta["agent_name"], meta["session_id"], meta["status"]) == (
        "Remote Assistant",
        session.session_id,
        "completed",
    )
    assert meta["turn_id"].startswith("t_") and meta["timestamp"] > 0
    assert response == response["content"]  # and it is the reply's text itself
    # Consecutive chats continue one conversation (the client named it).
    again = session.chat("What did I say first?")
    assert again["metadata"]["session_id"] == session.session_id
    assert said(seed.fake.chat_requests[-1])[1:] == [
        ("user", "Hello remote agent!"),
        ("assistant", "echo: Hello remote agent!"),
        ("user", "What did I say first?"),
    ]
    assert [t["id"] for t in turns(server, session.session_id)] == [
        meta["turn_id"],
        again["metadata"]["turn_id"],
    ]
    session.close()


def test_the_remote_agent_server_contract(seed: Seed, server: Server) -> None:
    """What the page's Flask ``/agent`` route answers, tether's server answers itself:
    ``{content, session_id, metadata: {agent_name, timestamp}}`` (and ``turn_id``, ``status``;
    the timestamp is seconds since the epoch, not an ISO string)."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        data = {"message": "Process this data", "session_id": "contract-1"}
        body = c.post("/agent", json=data).json()
        assert body["content"] == "echo: Process this data"
        assert body["session_id"] == "contract-1"
        assert body["metadata"]["agent_name"] == "Remote Assistant"
        (turn,) = turns(server, "contract-1")
        assert body["metadata"]["timestamp"] == turn["ended_at"]
        again = {"message": "again", "session_id": "contract-1"}
        assert c.post("/agents/Remote Assistant", json=again).json()["content"] == "echo: again"
    assert said(seed.fake.chat_requests[-1])[0] == ("system", "You are a helpful remote assistant.")
    assert len(said(seed.fake.chat_requests[-1])) == 4  # the same session's history


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that accepts connections and never answers (the kernel accepts them: nothing
    reads what they send)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/agent"


def test_error_handling(silent_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    refused_url = f"http://127.0.0.1:{free_port()}/agent"  # nobody listens there
    for url in (silent_url, refused_url):
        session = Session(agent_url=url, timeout=1)
        started = time.monotonic()
        try:
            response = session.chat("Process this data")  # noqa: F841  # as documented
        except TimeoutError:
            print("Remote agent timeout")
        except ConnectionError:
            print("Could not connect to remote agent")
        elapsed = time.monotonic() - started
        assert elapsed < 1 + 1, f"{url}: {elapsed:.2f}s"
        session.close()
    assert capsys.readouterr().out.splitlines() == [
        "Remote agent timeout",
        "Could not connect to remote agent",
    ]


def test_error_handling_of_chat_async(silent_url: str) -> None:
    async def timed(url: str, expected: type[Exception]) -> None:
        with closing(Session(agent_url=url, timeout=1)) as session:
            started = time.monotonic()
            with pytest.raises(expected):
                await session.chat_async("Process this data")
            assert time.monotonic() - started < 1 + 1

    asyncio.run(timed(silent_url, TimeoutError))
    asyncio.run(timed(f"http://127.0.0.1:{free_port()}/agent", ConnectionError))


def test_remote_session_options(seed: Seed, tmp_path: Path, fake: FakeOpenAIServer) -> None:
    data = tmp_path / "keyed"
    key = create_key(data, "erin").secret  # a server with keys wants one
    srv = start_server(data, target=APP, env=model_env_of(fake))
    try:
        # fmt: off
        session = Session(
            # Remote agent URL
            agent_url=f"{srv.url}/agent",

            # Optional timeout (default: 30 seconds)
            timeout=60,

            # Optional headers for authentication
            headers={
                "Authorization": f"Bearer {key}",
                "X-API-Key": key
            }
        )
        # fmt: on
        assert session.chat("Hello with credentials") == "echo: Hello with credentials"
        # The conversation is the key's user's, and continues.
        assert session.chat("again")["metadata"]["session_id"] == session.session_id
        with srv.client(key) as c:
            items = c.get(f"/v1/sessions/{session.session_id}/items").json()["data"]
        assert [i["content"] for i in items if i["kind"] == "user"] == [
            "Hello with credentials",
            "again",
        ]
        session.close()
        # Without them the server says what it wants.
        anonymous = Session(agent_url=f"{srv.url}/agent")
        with closing(anonymous), pytest.raises(RemoteUnauthorized, match="API key"):
            anonymous.chat("Hello")
    finally:
        srv.stop()


REMOTE_AGENT_CLIENT = """
import asyncio

# Connect to remote agents
async def connect_to_agents():
    # Connect to different remote agents
    research_session = Session(
        agent_url="http://research-server:8000/agent"
    )

    analysis_session = Session(
        agent_url="http://analysis-server:8000/agent"
    )

    # Send tasks in parallel
    research_task = research_session.chat_async("Research market trends")
    analysis_task = analysis_session.chat_async("Analyse competitor data")

    # Wait for results
    research_result = await research_task
    analysis_result = await analysis_task

    return research_result, analysis_result

# Run the distributed system
results = asyncio.run(connect_to_agents())
"""


def test_complete_example_remote_agent_client(
    seed: Seed, tmp_path: Path, fake: FakeOpenAIServer, server: Server
) -> None:
    """Two remote agents, each on a server of its own, asked with ``chat_async``.

    The example's comment says the tasks are sent in parallel, but what it holds are coroutines,
    which run only when awaited: as written, Python asks one server, then the other (the
    original's example is wrong there, not its library). Gathered, the same two calls overlap."""
    research = server
    analysis = start_server(tmp_path / "analysis", target=APP, env=model_env_of(fake))
    fake.latency_ms = 800  # each answer takes a while: in parallel, the two turns overlap
    try:
        code = REMOTE_AGENT_CLIENT.replace("http://research-server:8000", research.url).replace(
            "http://analysis-server:8000", analysis.url
        )
        scope: dict[str, Any] = {"Session": Session}
        exec(code, scope)
        research_result, analysis_result = scope["results"]
        assert research_result == "echo: Research market trends"
        assert analysis_result == "echo: Analyse competitor data"
        for result in (research_result, analysis_result):
            assert result["metadata"]["agent_name"] == "Remote Assistant"
        first, second = ran(research, research_result), ran(analysis, analysis_result)
        assert first["ended_at"] <= second["started_at"]  # awaited one after the other

        async def gathered() -> tuple[Any, Any]:
            with (
                closing(Session(agent_url=f"{research.url}/agent")) as research_session,
                closing(Session(agent_url=f"{analysis.url}/agent")) as analysis_session,
            ):
                return await asyncio.gather(
                    research_session.chat_async("Research market trends"),
                    analysis_session.chat_async("Analyse competitor data"),
                )

        research_result, analysis_result = asyncio.run(gathered())
        first, second = ran(research, research_result), ran(analysis, analysis_result)
        # In parallel: each turn started before the other ended.
        assert first["started_at"] < second["ended_at"] and second["started_at"] < first["ended_at"]
    finally:
        analysis.stop()


def ran(server: Server, reply: Any) -> dict[str, Any]:
    """The turn that gave ``reply``, as its server recorded it."""
    (turn,) = turns(server, reply["metadata"]["session_id"])
    assert turn["id"] == reply["metadata"]["turn_id"]
    return turn
