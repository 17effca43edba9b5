"""Decisions across processes (issue 11): asked on one node, decided on another, run once.

Three ``tether serve`` processes share one PostgreSQL database; the ``counter`` agent's tool
writes a line to a file all of them share for every run, so "exactly once" is counted across
processes. A SQLite server stopped while a turn waits picks it up again after a restart.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.slow


def _wait(c: httpx.Client, sid: str, tid: str, want: set[str], within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while True:
        turn: dict[str, Any] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if turn["status"] in want:
            return turn
        assert time.monotonic() < deadline, turn
        time.sleep(0.05)


def _launches(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


@pytest.fixture
def launch_log(tmp_path: Path) -> Path:
    return tmp_path / "launches.log"


@pytest.fixture
def nodes(postgres_url: str, tmp_path: Path, launch_log: Path) -> Iterator[list[Server]]:
    env = {"LAUNCH_LOG": str(launch_log), "TETHER_LEASE_TTL": "2"}
    servers = [
        start_server(tmp_path / f"node{n}", "--store", postgres_url, "--node", f"node{n}", env=env)
        for n in range(3)
    ]
    yield servers
    for srv in servers:
        srv.stop(signal.SIGKILL)


def _ask(c: httpx.Client, sid: str, text: str) -> tuple[str, dict[str, Any]]:
    """Start a counted launch on ``c``'s node; return its turn id and the pending decision."""
    assert c.post("/v1/sessions", json={"agent": "counter", "session_id": sid}).status_code == 201
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": text})
    assert r.status_code == 202, r.text  # wait=true answers as soon as it waits for a human
    turn = r.json()
    assert turn["status"] == "awaiting_input"
    [decision] = turn["decisions"]
    assert decision["payload"]["tool"] == "counted_launch"
    return turn["id"], decision


def test_asked_on_a_decided_on_c_runs_once(nodes: list[Server], launch_log: Path) -> None:
    a, b, c = nodes
    with a.client() as ca, b.client() as cb, c.client() as cc:
        tid, decision = _ask(ca, "d1", "rocket")
        # Every node sees the same pending decision.
        listed = cb.get("/v1/sessions/d1/decisions", params={"status": "pending"}).json()
        assert listed["decisions"] == [decision]
        made = cc.post(
            f"/v1/sessions/d1/turns/{tid}/decisions",
            json={"call_id": decision["call_id"], "decision": "approve"},
        )
        assert made.status_code == 200 and made.json()["status"] == "approved"
        done = _wait(cb, "d1", tid, {"completed", "failed"}, 30)
        assert done["output"] == "tool said: launched rocket"
        items = cb.get("/v1/sessions/d1/items").json()["data"]
        assert [i["kind"] for i in items] == ["user", "tool_call", "tool_result", "assistant"]
        again = ca.post(
            f"/v1/sessions/d1/turns/{tid}/decisions",
            json={"call_id": decision["call_id"], "decision": "deny"},
        )
        assert again.status_code == 409 and again.json()["decision"]["status"] == "approved"
    [line] = _launches(launch_log)
    assert line.split()[1] == "rocket"


def test_the_asking_node_killed_while_waiting(nodes: list[Server], launch_log: Path) -> None:
    a, b, _ = nodes
    with a.client() as ca, b.client() as cb:
        tid, decision = _ask(ca, "d2", "probe")
        a.stop(signal.SIGKILL)
        made = cb.post(
            f"/v1/sessions/d2/turns/{tid}/decisions",
            json={"call_id": decision["call_id"], "decision": "approve"},
        )
        assert made.status_code == 200
        done = _wait(cb, "d2", tid, {"completed", "failed"}, 30)
        assert (done["status"], done["output"]) == ("completed", "tool said: launched probe")
        items = cb.get("/v1/sessions/d2/items").json()["data"]
        assert [i["kind"] for i in items] == ["user", "tool_call", "tool_result", "assistant"]
    # Once, and after the decision, so by a live node (the asking one was dead by then).
    [line] = _launches(launch_log)
    assert line.split()[1] == "probe"


def test_a_sqlite_server_restarted_while_a_turn_waits(tmp_path: Path, launch_log: Path) -> None:
    env = {"LAUNCH_LOG": str(launch_log)}
    data = tmp_path / "single"
    first = start_server(data, env=env)
    try:
        with first.client() as c:
            tid, decision = _ask(c, "d3", "balloon")
    finally:
        assert first.stop() == 0
    second = start_server(data, env=env)
    try:
        with second.client() as c:
            pending = c.get("/v1/sessions/d3/decisions", params={"status": "pending"}).json()
            assert pending["decisions"] == [decision]
            c.post(
                f"/v1/sessions/d3/turns/{tid}/decisions",
                json={"call_id": decision["call_id"], "decision": "approve"},
            )
            done = _wait(c, "d3", tid, {"completed", "failed"}, 30)
            assert done["output"] == "tool said: launched balloon"
    finally:
        second.stop()
    assert len(_launches(launch_log)) == 1


def test_a_decision_whose_asking_node_died_expires_near_its_deadline(
    postgres_url: str, tmp_path: Path, launch_log: Path
) -> None:
    """Nobody decides, and the node that asked is gone: the others did not know its deadline
    and found it on their next idle look, which came up to 30 s later (the turn and anything
    queued behind it waited so long)."""
    env = {"LAUNCH_LOG": str(launch_log), "TETHER_TEST_DECISION_TIMEOUT": "2"}
    a, b = (
        start_server(tmp_path / f"n{n}", "--store", postgres_url, "--node", f"n{n}", env=env)
        for n in range(2)
    )
    try:
        with a.client() as ca, b.client() as cb:
            time.sleep(0.5)  # both idle: each has looked for deadlines, and found none
            asked = time.monotonic()
            tid, _ = _ask(ca, "d9", "probe")
            a.stop(signal.SIGKILL)
            _wait(cb, "d9", tid, {"completed", "failed"}, 30)
            took = time.monotonic() - asked
            [decision] = cb.get(f"/v1/sessions/d9/turns/{tid}/decisions").json()["decisions"]
        assert decision["status"] == "expired"
        assert took < 2 + 5 + 3, took  # its deadline, the sweep's longest sleep, a margin
        assert _launches(launch_log) == []  # refused: the tool never ran
    finally:
        for srv in (a, b):
            srv.stop(signal.SIGKILL)
