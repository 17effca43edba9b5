"""The protocol faces across processes: a conversation begun through one ``tether serve`` is
read, continued and cancelled through another sharing its PostgreSQL database."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.conftest import Server, start_server
from tests.server.test_face_openai import SESSION, sdk

pytestmark = pytest.mark.slow


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[list[Server]]:
    env = {"TETHER_LEASE_TTL": "2"}
    servers = [
        start_server(tmp_path / f"node{n}", "--store", postgres_url, "--node", f"node{n}", env=env)
        for n in range(2)
    ]
    yield servers
    for srv in servers:
        srv.stop(signal.SIGKILL)


def test_an_openai_conversation_moves_between_processes(nodes: list[Server]) -> None:
    a, b = nodes
    with sdk(a) as ca, sdk(b) as cb:
        raw = ca.chat.completions.with_raw_response.create(
            model="echo", messages=[{"role": "user", "content": "one"}]
        )
        session = raw.headers[SESSION]
        reply = cb.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "two"}],
            extra_headers={SESSION: session},
        )
        assert reply.choices[0].message.content == "saw [one] then two"
        first = ca.responses.create(model="echo", input="three", conversation=session)
        second = cb.responses.create(model="echo", input="four", previous_response_id=first.id)
        assert second.output_text == "saw [one, two, three] then four"
        assert cb.responses.retrieve(first.id).output_text == first.output_text


def test_a_response_begun_on_one_process_is_cancelled_from_another(nodes: list[Server]) -> None:
    a, b = nodes
    with sdk(a) as ca, sdk(b) as cb:
        queued = ca.responses.create(model="slow", input="go", background=True)
        seen = queued.status
        for _ in range(500):
            seen = cb.responses.retrieve(queued.id).status
            if seen == "in_progress":
                break
            time.sleep(0.01)
        assert seen == "in_progress"
        assert cb.responses.cancel(queued.id).status == "cancelled"
        assert ca.responses.retrieve(queued.id).status == "cancelled"
