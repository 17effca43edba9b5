"""Per-principal bounds over HTTP: 429 with Retry-After, and nothing half-written."""

from __future__ import annotations

import pytest

from tests.server.conftest import ServerFactory

pytestmark = pytest.mark.slow


def test_one_caller_cannot_take_more_than_its_bounds(make_server: ServerFactory) -> None:
    srv = make_server(
        env={
            "TETHER_MAX_RUNNING_TURNS": "2",
            "TETHER_MAX_QUEUED_TURNS": "1",
            "TETHER_MAX_SESSIONS": "3",
        }
    )
    with srv.client() as c:
        for sid in ("a", "b", "c"):
            assert (
                c.post("/v1/sessions", json={"agent": "slow", "session_id": sid}).status_code == 201
            )
        over = c.post("/v1/sessions", json={"agent": "slow", "session_id": "d"})
        assert over.status_code == 429, over.text
        assert (
            over.json()["type"].endswith("limit-exceeded") and int(over.headers["Retry-After"]) >= 1
        )
        assert c.get("/v1/sessions/d").status_code == 404
        # /api/chat makes sessions too: the same bound.
        assert c.post("/api/chat", json={"message": "hi", "agent_name": "slow"}).status_code == 429

        # Two sessions answering at once (slow turns, ~2 s each), then a third is refused.
        for sid in ("a", "b"):
            r = c.post(f"/v1/sessions/{sid}/turns", json={"input": "go", "wait": False})
            assert r.status_code == 202, r.text
        third = c.post("/v1/sessions/c/turns", json={"input": "go", "wait": False})
        assert third.status_code == 429 and "Retry-After" in third.headers
        assert c.get("/v1/sessions/c/turns").json()["data"] == []
        # One turn may wait behind a busy session; the next is refused.
        assert (
            c.post("/v1/sessions/a/turns", json={"input": "next", "wait": False}).status_code == 202
        )
        assert (
            c.post("/v1/sessions/b/turns", json={"input": "next", "wait": False}).status_code == 429
        )
        assert [t["input"] for t in c.get("/v1/sessions/b/turns").json()["data"]] == ["go"]
