"""Three `tether serve` processes on one PostgreSQL database behave as one service."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.slow


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path) -> Iterator[list[Server]]:
    servers = [
        start_server(tmp_path / f"node{n}", "--store", postgres_url, "--node", f"node{n}")
        for n in range(3)
    ]
    yield servers
    for srv in servers:
        srv.stop()


def test_thirty_turns_on_one_session_round_robin_stay_serial(nodes: list[Server]) -> None:
    with nodes[0].client() as c:
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": "rr"}).status_code == 201

    async def one(client: httpx.AsyncClient, n: int) -> dict[str, object]:
        r = await client.post("/v1/sessions/rr/turns", json={"input": f"m{n:02d}"})
        assert r.status_code == 200, r.text
        body: dict[str, object] = r.json()
        return body

    async def run() -> list[dict[str, object]]:
        clients = [httpx.AsyncClient(base_url=srv.url, timeout=120) for srv in nodes]
        try:
            return await asyncio.gather(*(one(clients[n % 3], n) for n in range(30)))
        finally:
            for client in clients:
                await client.aclose()

    turns = asyncio.run(run())
    assert sorted(int(str(t["seq"])) for t in turns) == list(range(1, 31))
    with nodes[2].client() as c:
        items = c.get("/v1/sessions/rr/items", params={"limit": 100}).json()["data"]
    assert [i["kind"] for i in items] == ["user", "assistant"] * 30
    earlier: list[str] = []
    for n in range(0, 60, 2):
        user, reply = items[n]["content"], items[n + 1]["content"]
        # Each turn's model request saw exactly the turns committed before it.
        assert reply == f"saw [{', '.join(earlier)}] then {user}"
        earlier.append(user)


def test_cancel_sent_to_one_node_ends_a_turn_running_on_another(nodes: list[Server]) -> None:
    a, b = nodes[0], nodes[1]
    with a.client() as ca, b.client() as cb:
        assert ca.post("/v1/sessions", json={"agent": "slow", "session_id": "x"}).status_code == 201
        turn = ca.post("/v1/sessions/x/turns", json={"input": "go", "wait": False}).json()
        # Wait until it runs somewhere, then cancel it through another node.
        for _ in range(200):
            state = cb.get(f"/v1/sessions/x/turns/{turn['id']}").json()
            if state["status"] == "running":
                break
            time.sleep(0.02)
        ended = cb.post(f"/v1/sessions/x/turns/{turn['id']}/cancel").json()
        assert (ended["status"], ended["reason"]) == ("cancelled", "cancelled")
        # Whatever it had streamed is kept, flagged incomplete; a turn on a third node runs next.
        items = cb.get("/v1/sessions/x/items").json()["data"]
        assert items[0]["content"] == "go"
        assert all(not i["complete"] for i in items if i["kind"] == "assistant")
    with nodes[2].client() as cc:
        cc.post("/v1/sessions", json={"agent": "echo", "session_id": "y"})
        after = cc.post("/v1/sessions/y/turns", json={"input": "next"})
        assert after.status_code == 200 and after.json()["status"] == "completed"


def _wait_status(
    c: httpx.Client, sid: str, tid: str, want: set[str], within: float
) -> dict[str, object]:
    deadline = time.monotonic() + within
    while True:
        state: dict[str, object] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if state["status"] in want:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


@pytest.fixture
def short_lease_nodes(postgres_url: str, tmp_path: Path) -> Iterator[list[Server]]:
    env = {"TETHER_LEASE_TTL": "2"}
    servers = [
        start_server(tmp_path / f"n{n}", "--store", postgres_url, "--node", f"n{n}", env=env)
        for n in range(2)
    ]
    yield servers
    for srv in servers:
        srv.stop(signal.SIGKILL)


def test_kill_9_of_the_running_node_hands_the_session_on(
    short_lease_nodes: list[Server],
) -> None:
    a, b = short_lease_nodes
    with a.client() as ca, b.client() as cb:
        ca.post("/v1/sessions", json={"agent": "slow", "session_id": "k"})
        doomed = ca.post("/v1/sessions/k/turns", json={"input": "one", "wait": False}).json()
        _wait_status(ca, "k", doomed["id"], {"running"}, 10)
        queued = cb.post("/v1/sessions/k/turns", json={"input": "two", "wait": False}).json()
        a.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        started = _wait_status(cb, "k", queued["id"], {"running", "completed"}, 2 + 5)
        took = time.monotonic() - killed_at
        lost = cb.get(f"/v1/sessions/k/turns/{doomed['id']}").json()
        assert (lost["status"], lost["reason"]) == ("failed", "owner_lost")
        assert started["status"] in ("running", "completed")
        assert took < 2 + 5, took
        done = _wait_status(cb, "k", queued["id"], {"completed"}, 30)
        assert done["status"] == "completed"


def test_a_frozen_node_cannot_write_after_losing_its_lease(
    short_lease_nodes: list[Server],
) -> None:
    a, b = short_lease_nodes
    with a.client() as ca, b.client() as cb:
        ca.post("/v1/sessions", json={"agent": "slow", "session_id": "f"})
        frozen_turn = ca.post("/v1/sessions/f/turns", json={"input": "one", "wait": False}).json()
        _wait_status(ca, "f", frozen_turn["id"], {"running"}, 10)
        a.proc.send_signal(signal.SIGSTOP)
        try:
            nxt = cb.post("/v1/sessions/f/turns", json={"input": "two", "wait": False}).json()
            # b takes the session over once a's lease expires (a is alive, only frozen).
            _wait_status(cb, "f", nxt["id"], {"completed"}, 30)
            before = cb.get("/v1/sessions/f/items", params={"limit": 200}).json()["data"]
        finally:
            a.proc.send_signal(signal.SIGCONT)
        time.sleep(1.5)  # let the resumed node try to go on with its stale lease
        after = cb.get("/v1/sessions/f/items", params={"limit": 200}).json()["data"]
        assert after == before  # nothing of the stale owner landed
        old = cb.get(f"/v1/sessions/f/turns/{frozen_turn['id']}").json()
        assert (old["status"], old["reason"]) == ("failed", "owner_lost")
    assert "lease" in a.output()


def test_two_hundred_sessions_over_three_nodes_never_leak(nodes: list[Server]) -> None:
    canary = {n: f"canary-{n:03d}-{n * 7919:x}" for n in range(200)}

    async def converse(client: httpx.AsyncClient, n: int) -> list[str]:
        replies = []
        for t in range(3):
            r = await client.post(
                "/api/chat",
                json={"message": f"{canary[n]} #{t}", "session_id": f"c{n}", "agent_name": "echo"},
            )
            assert r.status_code == 200, r.text
            replies.append(r.json()["response"])
        return replies

    async def run() -> list[list[str]]:
        clients = [httpx.AsyncClient(base_url=srv.url, timeout=120) for srv in nodes]
        try:
            # Each session's turns go to all three nodes in turn.
            sem = asyncio.Semaphore(48)

            async def bounded(n: int) -> list[str]:
                async with sem:
                    return await converse(clients[n % 3], n)

            return await asyncio.gather(*(bounded(n) for n in range(200)))
        finally:
            for client in clients:
                await client.aclose()

    results = asyncio.run(run())
    for n, replies in enumerate(results):
        assert replies[2] == f"saw [{canary[n]} #0, {canary[n]} #1] then {canary[n]} #2"
        text = " ".join(replies)
        assert [m for m, c in canary.items() if m != n and c in text] == []


def test_policies_across_nodes(nodes: list[Server]) -> None:
    a, b, c = nodes
    with a.client() as ca, b.client() as cb, c.client() as cc:
        ca.post("/v1/sessions", json={"agent": "slow", "session_id": "p"})
        first = ca.post("/v1/sessions/p/turns", json={"input": "one", "wait": False}).json()
        _wait_status(ca, "p", first["id"], {"running"}, 10)
        busy = cb.post("/v1/sessions/p/turns", json={"input": "no", "policy": "reject"})
        assert busy.status_code == 409 and busy.json()["busy_turn_id"] == first["id"]
        second = cb.post(
            "/v1/sessions/p/turns", json={"input": "two", "policy": "interrupt", "wait": False}
        ).json()
        assert _wait_status(cc, "p", first["id"], {"interrupted"}, 10)["complete"] is False
        _wait_status(cc, "p", second["id"], {"running"}, 10)  # a 2-second reply
        third = cc.post(
            "/v1/sessions/p/turns", json={"input": "three", "policy": "rollback", "wait": False}
        ).json()
        rolled = _wait_status(ca, "p", second["id"], {"rolled_back", "completed"}, 10)
        assert rolled["status"] == "rolled_back"
        _wait_status(ca, "p", third["id"], {"completed"}, 30)
        items = ca.get("/v1/sessions/p/items", params={"limit": 200}).json()["data"]
    users = [i["content"] for i in items if i["kind"] == "user"]
    assert users == ["one", "three"]  # the rolled-back turn's items are gone, "no" never landed
