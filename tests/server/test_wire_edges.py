"""Edges of the wire the attack on a running server found: text no store can hold, integers past
64 bits, ids that cannot be ours, a resumed stream that never ends, a 405 that hides methods.

Every test runs on SQLite and again on PostgreSQL (when ``TETHER_TEST_POSTGRES_URL`` is set),
and answers the same on both: the backend never decides what a client gets.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.server.cli_keys import assert_problem
from tests.server.conftest import Server, backend_store, start_server

MAX_INT64 = 2**63 - 1


@dataclass
class Env:
    server: Server
    backend: str


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    data_dir = tmp_path_factory.mktemp(f"edges-{request.param}")
    with backend_store(request, data_dir) as store_url:
        server = start_server(data_dir, "--store", store_url)
        try:
            yield Env(server, request.param)
            # Every refusal was a problem the routes chose: nothing fell through to a 500.
            assert "unhandled error" not in server.output()
        finally:
            server.stop()


@pytest.fixture
def c(env: Env) -> Iterator[httpx.Client]:
    with env.server.client() as client:
        yield client


def new_session(c: httpx.Client) -> str:
    sid = f"edge-{uuid.uuid4().hex[:12]}"
    r = c.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
    assert r.status_code == 201, r.text
    return sid


def raw(c: httpx.Client, method: str, path: str, body: str) -> httpx.Response:
    """``body`` as written: JSON escapes such as ``\\ud800`` reach the server unparsed."""
    return c.request(
        method, path, content=body.encode(), headers={"content-type": "application/json"}
    )


# -- text no store can hold ------------------------------------------------------------------------
def test_lone_surrogates_in_metadata_or_state_are_400(c: httpx.Client) -> None:
    sid = new_session(c)
    before = c.get(f"/v1/sessions/{sid}").json()
    for method, path, body in [
        ("POST", "/v1/sessions", '{"agent": "echo", "metadata": {"a": "\\ud800"}}'),
        ("POST", "/v1/sessions", '{"agent": "echo", "metadata": {"\\udfff": 1}}'),
        ("PATCH", f"/v1/sessions/{sid}", '{"metadata": {"a": ["x", "\\ud83d"]}}'),
        ("PATCH", f"/v1/sessions/{sid}", '{"state": {"\\ud800": {"deep": "\\udc00"}}}'),
    ]:
        r = raw(c, method, path, body)
        assert_problem(r, 400, "invalid-input")
        assert "surrogate" in r.json()["detail"]
    # The connection held (no reset), and nothing was written.
    assert c.get(f"/v1/sessions/{sid}").json() == before
    # A surrogate *pair* is one ordinary character.
    r = raw(c, "PATCH", f"/v1/sessions/{sid}", '{"state": {"emoji": "\\ud83d\\ude00"}}')
    assert r.status_code == 200, r.text
    assert r.json()["state"] == {"emoji": "\U0001f600"}


def test_nul_in_a_message_is_refused_alike_everywhere(c: httpx.Client) -> None:
    sid = new_session(c)
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "a\x00b"})
    assert_problem(r, 400, "invalid-input")
    assert r.json()["detail"] == "the message must not contain NUL characters"
    r = c.post("/api/chat", json={"message": "a\x00b", "session_id": sid})
    assert_problem(r, 400, "invalid-input")
    assert c.get(f"/v1/sessions/{sid}/turns").json()["data"] == []
    assert c.get(f"/v1/sessions/{sid}/items").json()["data"] == []
    # Metadata is stored as JSON, where a NUL is an escape: kept, on every backend.
    r = c.patch(f"/v1/sessions/{sid}", json={"metadata": {"k\x00": "v\x00"}})
    assert r.status_code == 200 and r.json()["metadata"] == {"k\x00": "v\x00"}, r.text


# -- integers past 64 bits -------------------------------------------------------------------------
@pytest.mark.parametrize("revision", [MAX_INT64 + 1, 10**20])
def test_expected_revision_past_int64_is_a_422(c: httpx.Client, revision: int) -> None:
    sid = new_session(c)
    r = raw(c, "PATCH", f"/v1/sessions/{sid}", f'{{"expected_revision": {revision}}}')
    assert_problem(r, 422, "validation")
    assert r.json()["errors"][0]["field"] == "expected_revision"
    r = c.patch(f"/v1/sessions/{sid}", json={"expected_revision": MAX_INT64})
    assert_problem(r, 409, "conflict")  # in range: only the wrong revision


def test_a_patch_that_changes_nothing_makes_no_new_revision(c: httpx.Client) -> None:
    # Before, {} made a new revision each time: another client's expected_revision failed for
    # a change that never was.
    sid = new_session(c)
    first = c.get(f"/v1/sessions/{sid}").json()
    for body in ({}, {"expected_revision": first["revision"]}):
        r = c.patch(f"/v1/sessions/{sid}", json=body)
        assert r.status_code == 200, r.text
        assert (r.json()["revision"], r.json()["updated_at"]) == (
            first["revision"],
            first["updated_at"],
        )
    stale = c.patch(f"/v1/sessions/{sid}", json={"expected_revision": first["revision"] + 1})
    assert_problem(stale, 409, "conflict")
    changed = c.patch(f"/v1/sessions/{sid}", json={"state": {"step": 1}})
    assert changed.json()["revision"] == first["revision"] + 1


# -- ids that cannot be ours -----------------------------------------------------------------------
def test_ids_no_store_could_hold_are_404_like_unknown_ones(c: httpx.Client) -> None:
    sid = new_session(c)
    unknown = c.get("/v1/memory/mem_unknown")
    assert_problem(unknown, 404, "not-found")
    for method, path in [
        ("GET", "/v1/memory/mem_%00"),
        ("GET", "/v1/memory/%00"),
        ("DELETE", "/v1/memory/mem_%00"),
        ("GET", f"/v1/sessions/{sid}/turns/t_%00"),
        ("GET", f"/v1/sessions/{sid}/turns/t_%00/events"),
        ("POST", f"/v1/sessions/{sid}/turns/t_%00/cancel"),
        ("DELETE", "/v1/knowledge/kb/documents/doc_%00"),
        ("GET", "/v1/memory/mem_%C3%A9"),  # not in the id alphabet either
    ]:
        r = c.request(method, path)
        assert_problem(r, 404, "not-found")
        assert r.json() == unknown.json(), (method, path)
    r = c.patch("/v1/memory/mem_%00", json={"content": "x", "expected_revision": 1})
    assert r.json() == unknown.json()


# -- a resumed stream that ends --------------------------------------------------------------------
def _frames(text: str) -> list[tuple[str, str]]:
    """``(id, event)`` of each frame of an SSE body."""
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "id" in fields:
            out.append((fields["id"], fields["event"]))
    return out


def test_resuming_from_turn_ended_ends_the_stream(c: httpx.Client) -> None:
    sid = new_session(c)
    turn = c.post(f"/v1/sessions/{sid}/turns", json={"input": "hi"}).json()
    events = f"/v1/sessions/{sid}/turns/{turn['id']}/events"
    frames = _frames(c.get(events).text)
    (last_id, last_type), (before_id, _) = frames[-1], frames[-2]
    assert last_type == "turn.ended"
    # An EventSource reconnects with the id of the last frame it got: nothing more is coming,
    # and 204 is what tells it to stop (not a second turn.ended, which would make it loop).
    r = c.get(events, headers={"Last-Event-ID": last_id})
    assert r.status_code == 204 and r.content == b"", r.text
    r = c.get(events, params={"after": last_id.rpartition(":")[2]})
    assert r.status_code == 204
    # One frame earlier: only the terminal event, once.
    r = c.get(events, headers={"Last-Event-ID": before_id})
    assert _frames(r.text) == [(last_id, "turn.ended")]


# -- what a 405 says -------------------------------------------------------------------------------
def test_a_405_names_every_method_of_the_path(c: httpx.Client) -> None:
    for method, path, allowed in [
        ("OPTIONS", "/v1/sessions/abc", "GET, PATCH, DELETE"),
        ("PUT", "/v1/sessions/abc", "GET, PATCH, DELETE"),
        ("OPTIONS", "/v1/sessions", "GET, POST"),
        ("PATCH", "/v1/memory", "GET, POST, DELETE"),
        ("GET", "/v1/sessions/abc/turns/t_x/cancel", "POST"),
    ]:
        r = c.request(method, path)
        assert_problem(r, 405, "method-not-allowed")
        assert r.headers["allow"] == allowed, (method, path)


# -- conditional writes ----------------------------------------------------------------------------
def test_a_memory_rewrite_must_name_its_revision(c: httpx.Client) -> None:
    item = c.post("/v1/memory", json={"content": "edges: the original"}).json()
    path = f"/v1/memory/{item['id']}"
    assert_problem(c.patch(path, json={"content": "new"}), 428, "precondition-required")
    # b"\xb2" is "²" in Latin-1, as servers read header bytes: a digit to str.isdigit().
    for bad in (b"null", b"*", b"\xb2", b'"3', b"W/3x"):
        r = c.patch(path, json={"content": "new"}, headers={b"If-Match": bad})
        assert_problem(r, 400, "invalid-input")
    assert c.get(path).json() == item
    r = c.patch(path, json={"content": "new"}, headers={"If-Match": 'W/"1"'})
    assert r.status_code == 200 and r.json()["revision"] == 2, r.text
    c.delete(path)
