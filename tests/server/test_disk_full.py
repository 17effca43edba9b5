"""``tether serve`` on SQLite when the store's disk fills up: writes answer 503 (never hang),
reads still answer, ``/readyz`` says 503 while ``/healthz`` stays 200, and everything works
again once space comes back. On a real, small tmpfs (the test skips where mounting is not
allowed, and says how to run it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.cli_keys import assert_problem
from tests.server.conftest import Server, start_server
from tests.tmpfs import fill, free_bytes, small_tmpfs

# The client waits this long at most: a request that never answers fails the test.
NO_HANG = 60.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    with small_tmpfs(tmp_path, 24, __file__) as mnt:
        # Only the store is on the small disk (the server's log and workspaces are not). A
        # short lease: the session whose lease could not be released while the disk was full
        # takes its next turn once it expires.
        srv = start_server(
            tmp_path / "data", "--store", str(mnt / "tether.db"), env={"TETHER_LEASE_TTL": "2"}
        )
        try:
            yield srv, mnt
        finally:
            srv.stop()


def upload(c: httpx.Client, name: str) -> httpx.Response:
    # About 300 KB of text: more than the room left in the WAL's last block, fewer chunks
    # than any per-document bound.
    text = "\n\n".join(f"Paragraph {n}: " + "lorem ipsum dolor sit amet " * 40 for n in range(256))
    return c.post("/v1/knowledge/notes/documents", files={"file": (name, text.encode())})


def turn(c: httpx.Client, sid: str, text: str) -> httpx.Response:
    return c.post(f"/v1/sessions/{sid}/turns", json={"input": text})


def test_a_full_disk_answers_503_and_the_server_recovers(server: tuple[Server, Path]) -> None:
    srv, mnt = server
    with httpx.Client(base_url=srv.url, timeout=NO_HANG) as c:
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": "s1"}).status_code == 201
        assert turn(c, "s1", "before").status_code == 200

        filler = fill(mnt)
        assert free_bytes(mnt) == 0
        assert_problem(upload(c, "big.md"), 503, "store-unavailable")
        assert_problem(turn(c, "s1", "while full"), 503, "store-unavailable")
        assert_problem(upload(c, "again.md"), 503, "store-unavailable")  # the store still answers
        # Reads answer; liveness is not readiness.
        assert c.get("/v1/sessions/s1").status_code == 200
        assert c.get("/healthz").status_code == 200
        assert_problem(c.get("/readyz"), 503, "store-unavailable")

        filler.unlink()
        deadline = time.monotonic() + NO_HANG
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "not ready again after space came back"
            time.sleep(0.1)
        r = upload(c, "big.md")
        assert r.status_code == 201, r.text
        r = turn(c, "s1", "after")
        assert r.status_code == 200, r.text
        r = c.get("/v1/sessions/s1/items")
        assert r.status_code == 200, r.text
        inputs = [i["content"] for i in r.json()["data"] if i["kind"] == "user"]
        assert inputs == ["before", "after"]  # the refused turn left nothing behind
    assert srv.proc.poll() is None
    assert "cannot rollback" not in srv.output()
