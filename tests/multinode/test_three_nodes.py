"""Three `tether serve` processes on one PostgreSQL database behave as one service."""

from __future__ import annotations

import asyncio
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
