"""No internal text in answers: a failing provider, the store's driver and the PDF parser say what
went wrong only in the server log; callers get a stable code and a short message of tether's.

A real ``tether serve`` of :mod:`tests.server.upstream_apps`: a dead upstream whose URL carries
a password, and the fake OpenAI server scripted to fail (a 401 that quotes the server's own key,
as some proxies do, and a 500 with internals in its body). Every answer a caller can get about
the failed turns is gathered: the HTTP answers (waited, streamed, ``/api/chat``), the turn
records, and the events replayed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.server.cli_keys import assert_problem
from tests.server.conftest import Server, free_port, start_server
from tests.server.upstream_apps import SERVER_KEY
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

PASSWORD = "hunter2-upstream-password"
NAME = "openai:fake-model"


@dataclass
class Env:
    server: Server
    fake: FakeOpenAIServer
    dead_port: int


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    dead_port = free_port()  # nothing listens there
    with FakeOpenAIServer() as fake:
        server = start_server(
            tmp_path_factory.mktemp("leaks"),
            target="tests.server.upstream_apps:app",
            env={
                "FAKE_OPENAI_URL": fake.base_url,
                "DEAD_UPSTREAM_URL": f"http://proxyuser:{PASSWORD}@127.0.0.1:{dead_port}/v1",
            },
        )
        try:
            yield Env(server, fake, dead_port)
        finally:
            server.stop()


@dataclass
class Seen:
    """Everything callers were told about the failed turns, and the last turn record."""

    text: str
    turn: dict[str, Any]


def fail_three_ways(server: Server, agent: str) -> Seen:
    """Three turns on ``agent``: waited for, streamed, and through ``/api/chat``."""
    sid = f"leak-{uuid.uuid4().hex[:10]}"
    answers: list[str] = []
    with server.client() as c:
        assert c.post("/v1/sessions", json={"agent": agent, "session_id": sid}).status_code == 201
        waited = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
        assert_problem(waited, 502, "turn-failed")
        answers.append(waited.text)
        with c.stream(
            "POST", f"/v1/sessions/{sid}/turns", json={"input": "hi", "stream": True}
        ) as s:
            answers.append(s.read().decode())
        chat = c.post("/api/chat", json={"message": "hi", "session_id": sid, "agent_name": agent})
        assert_problem(chat, 502, "turn-failed")
        answers.append(chat.text)
        turns = c.get(f"/v1/sessions/{sid}/turns")
        answers.append(turns.text)
        for turn in turns.json()["data"]:
            answers.append(c.get(f"/v1/sessions/{sid}/turns/{turn['id']}").text)
            answers.append(c.get(f"/v1/sessions/{sid}/turns/{turn['id']}/events").text)
        last: dict[str, Any] = turns.json()["data"][-1]
    assert '"turn.ended"' in "".join(answers) or "event: turn.ended" in "".join(answers)
    return Seen("\n".join(answers), last)


def assert_nothing_leaked(seen: Seen, *secrets: str) -> None:
    for secret in (SERVER_KEY, PASSWORD, "proxyuser", *secrets):
        assert secret not in seen.text, f"{secret!r} reached a caller"
    assert (seen.turn["status"], seen.turn["reason"]) == ("failed", "model_error")
    assert seen.turn["error"].startswith(f"{NAME}: the model provider ")


def test_a_dead_upstream_with_credentials_in_its_url(env: Env) -> None:
    seen = fail_three_ways(env.server, "dead")
    assert_nothing_leaked(seen, f"127.0.0.1:{env.dead_port}", "ConnectError", "refused", "/v1")
    assert seen.turn["error"] == f"{NAME}: the model provider could not be reached"
    # The operator's log says where and why, without the password.
    log = env.server.output()
    assert f"127.0.0.1:{env.dead_port}" in log
    assert "ConnectError" in log
    assert PASSWORD not in log


def test_a_401_that_quotes_the_servers_key(env: Env) -> None:
    body = f"Incorrect API key provided: Bearer {SERVER_KEY}. Find yours at https://example.test"
    env.fake.script(FakeError(401, body, times=3))
    seen = fail_three_ways(env.server, "upstream")
    assert_nothing_leaked(seen, "Incorrect API key", f"127.0.0.1:{env.fake.port}")
    assert seen.turn["error"] == f"{NAME}: the model provider answered HTTP 401 (key refused)"
    log = env.server.output()
    assert "Incorrect API key provided" in log
    assert SERVER_KEY not in log  # scrubbed from the upstream's words even there


def test_a_500_with_internals_in_its_body(env: Env) -> None:
    body = "upstream melted: worker /srv/llm/worker.py:42 lost GPU 3"
    env.fake.script(FakeError(500, body, times=6))  # 3 turns x 2 attempts
    seen = fail_three_ways(env.server, "upstream")
    assert_nothing_leaked(seen, "melted", "worker.py", f"127.0.0.1:{env.fake.port}")
    assert seen.turn["error"] == f"{NAME}: the model provider answered HTTP 500 (server error)"
    assert "upstream melted" in env.server.output()


def test_a_broken_pdf_is_refused_without_the_parsers_words(env: Env) -> None:
    pdf = b"%PDF-1.4\n1 0 obj garbage trailer<</Root 9 0 R>>"
    with env.server.client() as c:
        r = c.post(
            "/v1/knowledge/leaks/documents",
            files={"file": ("broken.pdf", pdf, "application/pdf")},
        )
    assert_problem(r, 400, "invalid-input")
    assert r.json()["detail"] == "broken.pdf: not a readable PDF"


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory: pytest.TempPathFactory, postgres_database: str) -> Iterator[Server]:
    from tests.conformance.postgres_db import fresh_schema

    schema = fresh_schema(postgres_database)
    url = next(schema)
    data_dir: Path = tmp_path_factory.mktemp("leaks-pg")
    server = start_server(data_dir, "--store", url, target="tests.server.upstream_apps:app")
    try:
        yield server
    finally:
        server.stop()
        next(schema, None)


DRIVER_WORDS = ("PostgreSQL", "query argument", "$", "int64", "UTF8", "0x00", "encoding")


@pytest.mark.parametrize(
    ("method", "path", "body", "detail"),
    [
        (
            "PATCH",
            "/v1/sessions/{sid}",
            {"metadata": {}, "expected_revision": 2**63 + 5},
            "less than or equal to 9223372036854775807",  # the schema's bound, before the store
        ),
        ("POST", "/v1/sessions/{sid}/turns", {"input": "a\u0000b"}, "must not contain NUL"),
        ("GET", "/v1/memory/mem_%00", None, None),
    ],
    ids=["int64", "nul", "nul-in-path"],
)
def test_postgres_driver_text_stays_in_the_log(
    pg_server: Server, method: str, path: str, body: Any, detail: str | None
) -> None:
    sid = f"pg-{uuid.uuid4().hex[:10]}"
    with pg_server.client() as c:
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": sid}).status_code == 201
        r = c.request(method, path.format(sid=sid), json=body)
    assert 400 <= r.status_code < 500, r.text
    text = json.dumps(r.json())
    for word in DRIVER_WORDS:
        assert word not in text, f"{word!r} reached the caller: {text}"
    if detail is not None:
        assert detail in r.json()["detail"]


def test_turn_error_fields_are_short(env: Env) -> None:
    """Whatever the upstream said, the recorded error is one line of ours."""
    env.fake.script(FakeError(400, "x" * 5000 + "\nline two"))
    sid = f"leak-{uuid.uuid4().hex[:10]}"
    with env.server.client() as c:
        c.post("/v1/sessions", json={"agent": "upstream", "session_id": sid})
        r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"})
    error = r.json()["turn"]["error"]
    assert error == f"{NAME}: the model provider answered HTTP 400 (request refused)"
