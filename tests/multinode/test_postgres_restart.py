"""PostgreSQL restarting under load: fast 503s, nothing committed lost, nothing left running.

Restarting the database server is not something a test suite may do to a developer's machine
unasked, so this runs only when ``TETHER_TEST_POSTGRES_RESTART`` holds the command that restarts
it (``.ci/run`` sets it to ``pg_ctlcluster <version> <cluster> restart`` when it can).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

RESTART = os.environ.get("TETHER_TEST_POSTGRES_RESTART", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not RESTART,
        reason="set TETHER_TEST_POSTGRES_RESTART to a command that restarts the PostgreSQL of"
        " TETHER_TEST_POSTGRES_URL (e.g. 'pg_ctlcluster 15 main restart') to run this",
    ),
]
SESSIONS = 12


@dataclass
class Outcome:
    sid: str
    input: str
    code: int
    seconds: float
    body: dict[str, object] = field(default_factory=dict)


# postgres_to_myself: make test's other processes hold their PostgreSQL tests meanwhile.
@pytest.fixture
def nodes(postgres_to_myself: None, postgres_url: str, tmp_path: Path) -> Iterator[list[Server]]:
    env = {"TETHER_LEASE_TTL": "3"}
    servers = [
        start_server(tmp_path / f"n{n}", "--store", postgres_url, "--node", f"n{n}", env=env)
        for n in range(2)
    ]
    yield servers
    for srv in servers:
        srv.stop()


def _ready(srv: Server) -> bool:
    try:
        return httpx.get(srv.url + "/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_postgres_restart_under_load(nodes: list[Server]) -> None:
    pids = [srv.proc.pid for srv in nodes]
    with nodes[0].client() as c:
        for n in range(SESSIONS):
            r = c.post("/v1/sessions", json={"agent": "steady", "session_id": f"r{n}"})
            assert r.status_code == 201, r.text

    outcomes: list[Outcome] = []
    lock = threading.Lock()
    restarted = threading.Event()
    stop = threading.Event()

    def load(n: int) -> None:
        sid = f"r{n}"
        clients = [srv.client(timeout=60) for srv in nodes]
        after = 0
        try:
            for k in range(10_000):
                if stop.is_set():
                    return
                text = f"{sid}-{k}"
                began = time.monotonic()
                try:
                    r = clients[k % 2].post(f"/v1/sessions/{sid}/turns", json={"input": text})
                    code, body = r.status_code, r.json()
                except httpx.TransportError as exc:
                    code, body = 0, {"error": repr(exc)}
                with lock:
                    outcomes.append(Outcome(sid, text, code, time.monotonic() - began, body))
                if code != 200:
                    time.sleep(0.1)
                elif restarted.is_set():
                    after += 1
                    if after >= 3:
                        return  # this session is back to work after the restart
        finally:
            for client in clients:
                client.close()

    threads = [threading.Thread(target=load, args=(n,)) for n in range(SESSIONS)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # load running on both nodes
    subprocess.run(RESTART, shell=True, check=True, timeout=60)
    restarted.set()
    for t in threads:
        t.join(timeout=90)
    stop.set()
    assert not any(t.is_alive() for t in threads), "a session never recovered after the restart"

    # The servers recovered by themselves: the very same processes, ready again.
    assert [srv.proc.pid for srv in nodes] == pids
    assert all(srv.proc.poll() is None for srv in nodes)
    assert all(_ready(srv) for srv in nodes)

    codes = {o.code for o in outcomes}
    assert codes <= {200, 503}, sorted((o.code, o.body) for o in outcomes if o.code != 200)[:5]
    failed = [o for o in outcomes if o.code == 503]
    for o in failed:
        assert o.body.get("status") == 503 and "type" in o.body  # problem+json
    # Failing fast: an outage answers within seconds, it does not hang the caller.
    assert all(o.seconds < 20 for o in failed), max(o.seconds for o in failed)

    endings: Counter[str] = Counter()
    with nodes[1].client() as c:
        deadline = time.monotonic() + 30
        for n in range(SESSIONS):
            turns = _settled_turns(c, f"r{n}", deadline)
            endings.update(f"{t['status']}/{t['reason']}" for t in turns)
            _check_history(c, f"r{n}", turns, outcomes)
    assert failed, "the restart caused no 503 at all: did it happen under load?"
    print(
        f"{len(outcomes)} requests, {len(failed)} answered 503"
        f" (slowest {max(o.seconds for o in failed):.2f} s); turns: {dict(endings)}"
    )


def _settled_turns(c: httpx.Client, sid: str, deadline: float) -> list[dict[str, Any]]:
    """The session's turns once none is queued or running: those caught by the restart end
    (owner_lost at worst) within a lease."""
    while True:
        turns: list[dict[str, Any]] = c.get(
            f"/v1/sessions/{sid}/turns", params={"limit": 500}
        ).json()["data"]
        if not any(t["status"] in ("queued", "running") for t in turns):
            return turns
        assert time.monotonic() < deadline, [t for t in turns if t["status"] == "running"]
        time.sleep(0.2)


def _check_history(
    c: httpx.Client, sid: str, turns: list[dict[str, Any]], outcomes: list[Outcome]
) -> None:
    items = c.get(f"/v1/sessions/{sid}/items", params={"limit": 1000}).json()["data"]
    texts = [i["content"] for i in items if i["kind"] == "user"]
    for o in outcomes:
        if o.sid == sid and o.code == 200:
            # Nothing committed is lost: every answered turn is in the history.
            assert o.body["status"] == "completed"
            assert o.input in texts
    by_turn: dict[str, list[str]] = {}
    for i in items:
        by_turn.setdefault(i["turn_id"], []).append(i["kind"])
    completed = {str(t["id"]) for t in turns if t["status"] == "completed"}
    for tid in completed:
        assert by_turn[tid] == ["user", "assistant"], by_turn[tid]
