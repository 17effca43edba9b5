"""A stream that hears its turn end reads the ending it heard, on every backend.

The OpenAI, Responses and AG-UI doors hear ``turn.ended`` on the process's live feed and then
read the turn from the store to answer with it. On PostgreSQL that read takes another pool
connection than the ending's write; when ``turn.ended`` was published before the write
committed, the read found the turn running still, and the client got "waiting for a human
decision" (chat completions), a stream that stopped short of ``response.completed``
(Responses) or a ``RUN_ERROR`` (AG-UI) for a turn that completed (a new user's review found
it in 4 streams of 5). Each test runs on SQLite and on PostgreSQL (when
``TETHER_TEST_POSTGRES_URL`` is set); the ending is now published once it is stored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping

import httpx
import pytest

from tests.server.conftest import Server, backend_store, start_server

STREAMS = 12
"""Streams a door: the review saw the race in 4 of 5 on PostgreSQL."""


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    data_dir = tmp_path_factory.mktemp(f"endings-{request.param}")
    with backend_store(request, data_dir) as store_url:
        srv = start_server(data_dir, "--store", store_url)
        try:
            yield srv
        finally:
            srv.stop()


def sse_data(c: httpx.Client, path: str, body: Mapping[str, object]) -> list[str]:
    """The ``data:`` payloads of a streamed POST, in order."""
    with c.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]


def test_every_streamed_chat_completion_ends_with_its_finish_and_done(server: Server) -> None:
    with server.client() as c:
        for n in range(STREAMS):
            body = {
                "model": "echo",
                "stream": True,
                "messages": [{"role": "user", "content": f"c{n}"}],
            }
            data = sse_data(c, "/v1/chat/completions", body)
            assert data[-1] == "[DONE]", data[-3:]
            chunks = [json.loads(d) for d in data[:-1]]
            assert not [ch for ch in chunks if "error" in ch], chunks[-2:]
            finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch.get("choices")]
            assert finishes[-1] == "stop"
            text = "".join(
                ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch.get("choices")
            )
            assert text == f"saw [] then c{n}"


def test_every_streamed_response_ends_completed(server: Server) -> None:
    with server.client() as c:
        for n in range(STREAMS):
            data = sse_data(c, "/v1/responses", {"model": "echo", "stream": True, "input": f"r{n}"})
            types = [json.loads(d)["type"] for d in data]
            assert types[-1] == "response.completed", types[-3:]
            done = json.loads(data[-1])["response"]
            assert done["status"] == "completed"
            assert done["output"][0]["content"][0]["text"] == f"saw [] then r{n}"


def test_every_agui_run_finishes(server: Server) -> None:
    with server.client() as c:
        for n in range(STREAMS):
            body = {
                "threadId": f"th-{uuid.uuid4().hex[:8]}",
                "runId": f"run-{n}",
                "state": {},
                "messages": [{"id": "m0", "role": "user", "content": f"a{n}"}],
                "tools": [],
                "context": [],
                "forwardedProps": {},
            }
            events = [json.loads(d) for d in sse_data(c, "/agui/echo", body)]
            types = [e["type"] for e in events]
            assert "RUN_ERROR" not in types, events[-1]
            assert types[-1] == "RUN_FINISHED", types[-3:]
