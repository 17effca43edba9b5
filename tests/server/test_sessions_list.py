"""``GET /v1/sessions`` as the console reads it: the most recently active first, searched by id,
each with its status (idle, busy, awaiting input), counts and agents — the caller's only."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.server.conftest import Server

pytestmark = pytest.mark.slow


def _ids(body: dict[str, Any]) -> list[str]:
    return [s["session_id"] for s in body["data"]]


def test_newest_first_searched_and_detailed(server: Server) -> None:
    with server.client() as c:
        for sid in ("list-a", "list-b", "list-c"):
            made = c.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
            assert made.status_code == 201
            # The same shape as a read's: no turn sent to an agent yet is [], not null.
            fresh = made.json()
            assert (fresh["status"], fresh["turn_count"], fresh["agents"]) == ("idle", 0, [])
            assert c.get(f"/v1/sessions/{sid}").json()["agents"] == []
        c.post("/v1/sessions/list-a/turns", json={"input": "hi"})  # list-a is now the newest
        r = c.get("/v1/sessions", params={"order": "newest", "q": "list-"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert _ids(body)[:3] == ["list-a", "list-c", "list-b"]
        a = body["data"][0]
        assert (a["status"], a["item_count"], a["turn_count"], a["agents"]) == (
            "idle",
            2,
            1,
            ["echo"],
        )
        # Paging through, two at a time, gives the same order once.
        seen: list[str] = []
        params: dict[str, str | int] = {"order": "newest", "q": "list-", "limit": 2}
        while True:
            page = c.get("/v1/sessions", params=params).json()
            seen += _ids(page)
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
        assert seen == _ids(body)
        # The search is within the caller's sessions, and a bad cursor is a clear 4xx.
        assert c.get("/v1/sessions", params={"q": "list-b"}).json()["data"][0]["session_id"] == (
            "list-b"
        )
        assert c.get("/v1/sessions", params={"order": "newest", "cursor": "x"}).status_code == 400
        assert c.get("/v1/sessions", params={"order": "oldest"}).status_code == 422


def test_a_session_waiting_for_a_human_says_so(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/sessions", json={"agent": "approver", "session_id": "list-wait"})
        r = c.post("/v1/sessions/list-wait/turns", json={"input": "launch"})
        assert r.status_code == 202 and r.json()["status"] == "awaiting_input"
        one = c.get("/v1/sessions/list-wait").json()
        assert (one["status"], one["agents"]) == ("awaiting_input", ["approver"])
        listed = c.get("/v1/sessions", params={"q": "list-wait"}).json()["data"]
        assert [s["status"] for s in listed] == ["awaiting_input"]
        # Two agents of the app on one session are both named, first seen first.
        c.post("/v1/sessions", json={"agent": "researcher", "session_id": "list-two"})
        c.post("/v1/sessions/list-two/turns", json={"input": "find"})
        c.post("/v1/sessions/list-two/turns", json={"input": "write", "agent": "writer"})
        assert c.get("/v1/sessions/list-two").json()["agents"] == ["researcher", "writer"]


def test_listing_while_sessions_are_deleted_never_fails(server: Server) -> None:
    """A session deleted between the page's read and its details is left out of the page; the
    list is never a 404 because another request deleted one of the caller's sessions."""
    stop = threading.Event()

    def churn(n: int) -> None:
        with server.client() as c:
            i = 0
            while not stop.is_set():
                sid = f"churn-{n}-{i}"
                c.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
                c.delete(f"/v1/sessions/{sid}")
                i += 1

    churners = [threading.Thread(target=churn, args=(n,)) for n in range(3)]
    for t in churners:
        t.start()
    statuses: list[int] = []
    try:
        with server.client() as c:
            for _ in range(300):
                statuses.append(c.get("/v1/sessions", params={"q": "churn-"}).status_code)
    finally:
        stop.set()
        for t in churners:
            t.join()
    assert set(statuses) == {200}
