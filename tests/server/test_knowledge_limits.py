"""Per-user bounds on knowledge and memory over real HTTP: what one document may cost to read in,
what one user may keep, and how many documents they may have read in at once.

Each refusal is a problem+json (413 ``too-large`` or ``storage-quota``, 429 with
``Retry-After``) and leaves nothing stored. Storage is counted by the store, so these run on
SQLite and again on PostgreSQL (when ``TETHER_TEST_POSTGRES_URL`` is set).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.memory.pdf_bomb import content_stream_bomb
from tests.server.cli_keys import assert_problem
from tests.server.conftest import Server, backend_store, start_server

QUOTA = 40_000
"""Bytes of storage each user of the quota server may keep (an item's embedding is 1 KiB)."""


def _start(request: pytest.FixtureRequest, data_dir: Path, env: dict[str, str]) -> Iterator[Server]:
    with backend_store(request, data_dir) as store_url:
        server = start_server(data_dir, "--store", store_url, env=env)
        try:
            yield server
            assert "unhandled error" not in server.output()
        finally:
            server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def defaults(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server with the default bounds."""
    yield from _start(request, tmp_path_factory.mktemp(f"limits-{request.param}"), {})


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def tight(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A server whose bounds a test reaches with small documents."""
    env = {
        "TETHER_MAX_DOCUMENT_CHARS": "100000",
        "TETHER_MAX_DOCUMENT_CHUNKS": "50",
        "TETHER_MAX_STORAGE_BYTES": str(QUOTA),
        "TETHER_MAX_INGESTIONS": "1",
    }
    yield from _start(request, tmp_path_factory.mktemp(f"tight-{request.param}"), env)


@pytest.fixture
def c(tight: Server) -> Iterator[httpx.Client]:
    """A client of the tight server's one (local) user, who starts with nothing stored."""
    with tight.client() as client:
        assert client.delete("/v1/users/me/data").status_code == 200
        yield client


def upload(c: httpx.Client, collection: str, name: str, data: bytes, kind: str) -> httpx.Response:
    return c.post(f"/v1/knowledge/{collection}/documents", files={"file": (name, data, kind)})


def documents(c: httpx.Client, collection: str) -> list[str]:
    r = c.get(f"/v1/knowledge/{collection}/documents")
    assert r.status_code == 200, r.text
    return [d["name"] for d in r.json()["data"]]


def collection() -> str:
    return f"kb-{uuid.uuid4().hex[:8]}"


# -- one document ----------------------------------------------------------------------------------
def test_a_pdf_bomb_is_refused_and_nothing_is_stored(defaults: Server) -> None:
    kb = collection()
    bomb = content_stream_bomb(pages=100)  # 21 KB; 22 million characters
    with defaults.client() as c:
        r = upload(c, kb, "bomb.pdf", bomb, "application/pdf")
        assert_problem(r, 413, "too-large")
        assert "bomb.pdf" in r.json()["detail"]
        assert documents(c, kb) == []
        hits = c.post(f"/v1/knowledge/{kb}/search", json={"query": "lorem ipsum"}).json()
        assert hits["data"] == []
        # The server is fine, and takes a real document next.
        r = upload(c, kb, "fine.txt", b"A fine document about lorem ipsum.", "text/plain")
        assert r.status_code == 201, r.text
        assert documents(c, kb) == ["fine.txt"]


def test_extraction_stops_at_the_character_bound(c: httpx.Client) -> None:
    kb = collection()
    # Three pages of 220,000 characters each, against a bound of 100,000.
    r = upload(c, kb, "pages.pdf", content_stream_bomb(pages=3), "application/pdf")
    assert_problem(r, 413, "too-large")
    assert "over 100,000 characters" in r.json()["detail"]
    r = upload(c, kb, "long.txt", b"word " * 20_001, "text/plain")
    assert_problem(r, 413, "too-large")
    r = upload(
        c, kb, "many.md", "".join(f"# {n}\nx\n" for n in range(51)).encode(), "text/markdown"
    )
    assert_problem(r, 413, "too-large")
    assert "over 50 chunks" in r.json()["detail"]
    assert documents(c, kb) == []


# -- what one user keeps ---------------------------------------------------------------------------
def test_a_user_keeps_no_more_than_their_quota(c: httpx.Client) -> None:
    kb = collection()
    items = []
    while True:
        r = c.post("/v1/memory", json={"content": "a note " + "x" * 2_000})
        if r.status_code != 201:
            break
        items.append(r.json())
        assert len(items) < 100, "the quota never bit"
    assert_problem(r, 413, "storage-quota")
    assert f"of your {QUOTA:,} bytes are in use" in r.json()["detail"]
    assert len(items) == QUOTA // (2_007 + 1_024)  # each: its text and a 256-float embedding
    listed = c.get("/v1/memory", params={"limit": 200}).json()["data"]
    assert [i["id"] for i in listed] == [i["id"] for i in items]  # the refused one is absent

    # A document that would not fit is refused whole.
    r = upload(c, kb, "notes.txt", b"word " * 1_000, "text/plain")
    assert_problem(r, 413, "storage-quota")
    assert documents(c, kb) == []
    # A rewrite that grows an item is a write too; one that shrinks it always fits.
    first = items[0]
    r = c.patch(
        f"/v1/memory/{first['id']}",
        json={"content": first["content"] + "y" * 3_000, "expected_revision": 1},
    )
    assert_problem(r, 413, "storage-quota")
    r = c.patch(f"/v1/memory/{first['id']}", json={"content": "short", "expected_revision": 1})
    assert r.status_code == 200, r.text

    # Forgetting makes room again.
    assert c.delete("/v1/memory", params={"scope": "user"}).status_code == 200
    r = upload(c, kb, "notes.txt", b"word " * 1_000, "text/plain")
    assert r.status_code == 201, r.text
    assert documents(c, kb) == ["notes.txt"]


def test_one_user_at_a_time_past_the_ingestion_bound(tight: Server, c: httpx.Client) -> None:
    """The bound is taken before the body is read: an upload whose body is still coming
    holds it, and another one is answered 429 with Retry-After at once."""
    kb = collection()
    release = threading.Event()

    class Slow(threading.Thread):
        def __init__(self) -> None:
            super().__init__()
            self.sent = threading.Event()
            self.answer: httpx.Response | None = None

        def body(self) -> Iterator[bytes]:
            yield b'--b\r\nContent-Disposition: form-data; name="file"; filename="slow.txt"\r\n'
            yield b"Content-Type: text/plain\r\n\r\n"
            self.sent.set()
            release.wait(30)
            yield b"A slow document.\r\n--b--\r\n"

        def run(self) -> None:
            with tight.client() as slow:
                self.answer = slow.post(
                    f"/v1/knowledge/{kb}/documents",
                    content=self.body(),
                    headers={"content-type": "multipart/form-data; boundary=b"},
                )

    sender = Slow()
    try:
        for attempt in range(20):
            sender.start()
            assert sender.sent.wait(30)
            r = upload(c, kb, f"quick-{attempt}.txt", b"quick text", "text/plain")
            if r.status_code == 429:
                break
            # This one got in first (the slow one's request had not reached the route yet):
            # the slow one was the one refused. Again.
            assert r.status_code == 201, r.text
            sender.join(30)
            assert sender.answer is not None and sender.answer.status_code == 429
            sender = Slow()
        assert_problem(r, 429, "too-many-ingestions")
        assert r.headers["retry-after"] == "5"
        release.set()
        sender.join(30)
        assert sender.answer is not None and sender.answer.status_code == 201, sender.answer
        assert "slow.txt" in documents(c, kb)
        assert upload(c, kb, "after.txt", b"the slot is free", "text/plain").status_code == 201
    finally:
        release.set()
        if sender.is_alive():
            sender.join(30)
