"""The server answers over real HTTP."""

from __future__ import annotations

from tests.server.conftest import Server


def test_health_and_agents(server: Server) -> None:
    with server.client() as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ok"}
        names = [a["name"] for a in c.get("/v1/agents").json()["data"]]
        assert names[:3] == ["echo", "slow", "approver"]
