"""``tether serve --workers N``: N processes on one port and one store behave as one server.

Real processes throughout: the parent binds the port, forks the workers and hands each
connection it accepts to the next worker in turn, and the turns of one session still run one at a
time, in the order they were accepted, whichever worker accepted each. A worker killed with
``kill -9`` is started again and its turn ends with a recorded status; SIGTERM to the parent
drains every worker and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import PYTHONPATH, ROOT, Server, free_port, start_server
from tether.errors import ConfigError
from tether.server.settings import Settings
from tether.server.workers import check_workers, worker_node
from tether.testing.fake_openai import FakeOpenAIServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for the pids"),
]

BANNER = "tether: serving "
NODES = {"node-w1", "node-w2"}
TERMINAL = {"completed", "failed", "cancelled", "interrupted", "rolled_back", "limit_reached"}


# -- processes -------------------------------------------------------------------------------------
def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, … (None: no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def workers_of(parent: int) -> set[int]:
    """The live child processes of ``parent``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[1]) == parent:
                found.add(int(entry.name))
    return found


def wait_for(what: Callable[[], bool], within: float, srv: Server, why: str) -> None:
    deadline = time.monotonic() + within
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"{why} within {within} s:\n{srv.output()}")
        time.sleep(0.05)


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """Start ``tether serve --workers N`` on a fresh data directory; returns once every worker
    serves (the banner comes then). Each is stopped at the end, its workers with it."""
    started: list[Server] = []

    def go(*args: str, workers: int = 2, env: dict[str, str] | None = None) -> Server:
        srv = start_server(
            tmp_path / f"data{len(started)}", "--workers", str(workers), *args, env=env
        )
        started.append(srv)
        wait_for(lambda: BANNER in srv.output(), 30, srv, "no banner")
        return srv

    yield go
    for srv in started:
        srv.stop()


def fresh(srv: Server) -> httpx.Client:
    """A client that opens a new connection per request (so requests spread over workers, and
    none is stuck to a worker that was killed)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    return httpx.Client(base_url=srv.url, timeout=30, limits=limits)


def nodes_answering(srv: Server, want: set[str], tries: int = 300) -> set[str]:
    """Node names of the workers that answer ``/healthz``, until all of ``want`` have."""
    seen: set[str] = set()

    async def probe() -> None:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=srv.url, timeout=10, limits=limits) as client:
            for _ in range(0, tries, 10):
                answers = await asyncio.gather(*(client.get("/healthz") for _ in range(10)))
                seen.update(a.json()["node"] for a in answers)
                if want <= seen:
                    return

    asyncio.run(probe())
    return seen


def wait_status(
    c: httpx.Client, sid: str, tid: str, want: set[str], within: float
) -> dict[str, str]:
    deadline = time.monotonic() + within
    while True:
        state: dict[str, str] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if state["status"] in want:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.02)


def stored(db: Path, sql: str, *args: object) -> tuple[object, ...] | None:
    """One row read straight from the store's file (read-only, as another process would)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)) as c:
        row: tuple[object, ...] | None = c.execute(sql, args).fetchone()
        return row


# -- without a process ---------------------------------------------------------------------------
def test_each_worker_has_a_node_name_of_its_own_kept_across_restarts() -> None:
    assert [worker_node(None, i) for i in (1, 2)] == ["node-w1", "node-w2"]
    assert worker_node("eu-1", 3) == "eu-1-w3"


def test_a_memory_store_cannot_be_shared_by_workers() -> None:
    with pytest.raises(ConfigError, match="memory://"):
        check_workers(Settings(store="memory://", workers=2))


# -- one port, one store -------------------------------------------------------------------------
def test_two_workers_on_a_fresh_sqlite_dir_both_serve(launch: Callable[..., Server]) -> None:
    srv = launch()
    log = srv.output()
    assert log.count(BANNER) == 1, log  # once, when both serve
    assert f"on {srv.url} (store {srv.data_dir / 'tether.db'}, 2 workers)" in log, log
    pids = workers_of(srv.proc.pid)
    assert len(pids) == 2, pids
    assert nodes_answering(srv, NODES) == NODES
    # The parent migrated the fresh file once, before the workers opened it.
    versions = stored(
        srv.data_dir / "tether.db", "SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_version"
    )
    assert versions is not None and versions[0] == versions[1]
    with fresh(srv) as c:
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": "s"}).status_code == 201
        turn = c.post("/v1/sessions/s/turns", json={"input": "hi"}).json()
        assert (turn["status"], turn["output"]) == ("completed", "saw [] then hi")


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs or more; run on such a machine"
)
def test_each_worker_pins_its_loop_and_store_thread_to_a_cpu_of_its_own(
    launch: Callable[..., Server],
) -> None:
    srv = launch(env={"TETHER_PIN_CPU": "on"})
    allowed = frozenset(os.sched_getaffinity(0))

    def pinned_of(pid: int) -> dict[int, frozenset[int]]:
        out: dict[int, frozenset[int]] = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # ended meanwhile
                cpus = frozenset(os.sched_getaffinity(int(tid)))
                if cpus != allowed:
                    out[int(tid)] = cpus
        return out

    pids = workers_of(srv.proc.pid)
    # Each pins once its embedder has warmed up, a moment after it serves.
    wait_for(lambda: all(len(pinned_of(p)) == 2 for p in pids), 20, srv, "workers not pinned")
    cpus: dict[int, frozenset[int]] = {}
    for pid in pids:
        one = pinned_of(pid)
        assert len(one) == 2 and pid in one, one  # the event loop's thread and the store's
        (cpus[pid],) = set(one.values())
    assert len(set(cpus.values())) == 2, cpus  # different CPUs
    assert pinned_of(srv.proc.pid) == {}  # the supervisor pins nothing


def test_keep_alive_connections_are_shared_between_workers(
    launch: Callable[..., Server],
) -> None:
    """64 clients of one keep-alive connection each. Connecting one after another, they go to
    the workers in turn: 32 each, whatever else the machine is doing. Connecting all at once,
    neither worker is left with nearly none (the freer one takes more, within what each has not
    yet taken). Accepting on a shared socket, the worker awake first took most of a burst
    (57/7 and 64/0 were seen), and a connection stays with the worker that has it."""
    srv = launch()
    wait_for(lambda: nodes_answering(srv, NODES) == NODES, 30, srv, "both workers serving")

    async def connect(at_once: bool) -> list[str]:
        clients = [
            httpx.AsyncClient(base_url=srv.url, timeout=30, limits=httpx.Limits(max_connections=1))
            for _ in range(64)
        ]
        try:
            if at_once:
                first = await asyncio.gather(*(c.get("/healthz") for c in clients))
            else:
                first = [await c.get("/healthz") for c in clients]
            # The same connection answers again: the split holds for the connections' life.
            again = await asyncio.gather(*(c.get("/healthz") for c in clients))
            assert [a.json()["node"] for a in again] == [f.json()["node"] for f in first]
            return [f.json()["node"] for f in first]
        finally:
            await asyncio.gather(*(c.aclose() for c in clients))

    nodes = asyncio.run(connect(at_once=False))
    assert {node: nodes.count(node) for node in NODES} == {"node-w1": 32, "node-w2": 32}
    for _ in range(3):
        nodes = asyncio.run(connect(at_once=True))
        shares = {node: nodes.count(node) for node in NODES}
        assert min(shares.values()) >= 8, shares


async def pinned_clients(url: str, per_node: int) -> list[tuple[str, httpx.AsyncClient]]:
    """Clients of one keep-alive connection each, ``per_node`` of them on each worker: a
    connection stays with the worker that accepted it, so requests are known to reach each."""
    kept: dict[str, list[httpx.AsyncClient]] = {node: [] for node in NODES}
    for _ in range(40):
        # The kept ones too: a connection left idle past the server's keep-alive timeout (5 s,
        # on a busy machine) is closed, and its next request may reach the other worker.
        for node, clients in kept.items():
            pings = await asyncio.gather(*(client.get("/healthz") for client in clients))
            for client, ping in zip(list(clients), pings, strict=True):
                if ping.json()["node"] != node:
                    clients.remove(client)
                    await client.aclose()
        batch = [
            httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=1))
            for _ in range(8)
        ]
        answers = await asyncio.gather(*(client.get("/healthz") for client in batch))
        for client, answer in zip(batch, answers, strict=True):
            node = answer.json()["node"]
            if len(kept[node]) < per_node:
                kept[node].append(client)
            else:
                await client.aclose()
        if all(len(clients) == per_node for clients in kept.values()):
            return [(node, client) for node, clients in kept.items() for client in clients]
    for clients in kept.values():
        for client in clients:
            await client.aclose()
    raise AssertionError(f"connections did not reach every worker: {kept}")


def double_text(srv: Server, agents: list[str], per_session: int) -> list[dict[str, object]]:
    """Many clients, pinned to both workers, send ``per_session`` messages to each of one
    session per agent, all at once (policy enqueue); the turns, as each request got them."""

    async def run() -> list[dict[str, object]]:
        clients = await pinned_clients(srv.url, per_node=3)
        try:
            _, first = clients[0]
            for n, agent in enumerate(agents):
                made = await first.post(
                    "/v1/sessions", json={"agent": agent, "session_id": f"dt{n}"}
                )
                assert made.status_code == 201, made.text

            async def send(client: httpx.AsyncClient, sid: str, text: str) -> dict[str, object]:
                r = await client.post(f"/v1/sessions/{sid}/turns", json={"input": text})
                assert r.status_code == 200, r.text
                body: dict[str, object] = r.json()
                return body

            jobs = []
            for n in range(len(agents)):
                for m in range(per_session):
                    _, client = clients[(n * per_session + m) % len(clients)]
                    jobs.append(send(client, f"dt{n}", f"dt{n}-m{m:02d}"))
            turns = await asyncio.gather(*jobs)
            # Every connection is still on the worker it started with: both took turns.
            after = await asyncio.gather(*(client.get("/healthz") for _, client in clients))
            assert [a.json()["node"] for a in after] == [node for node, _ in clients]
            return turns
        finally:
            for _, client in clients:
                await client.aclose()

    return asyncio.run(run())


def check_serial(srv: Server, sid: str, turns: list[dict[str, object]], sent: int) -> list[str]:
    """Each message is in the history once, followed by its own reply, in the order the turns
    were accepted (their seq); the user messages in that order."""
    mine = sorted((t for t in turns if t["session_id"] == sid), key=lambda t: int(str(t["seq"])))
    assert [t["seq"] for t in mine] == list(range(1, sent + 1))
    assert {t["status"] for t in mine} == {"completed"}
    assert sorted(str(t["input"]) for t in mine) == [f"{sid}-m{m:02d}" for m in range(sent)]
    with fresh(srv) as c:
        items = c.get(f"/v1/sessions/{sid}/items", params={"limit": 200}).json()["data"]
    assert [i["kind"] for i in items] == ["user", "assistant"] * sent
    for k, turn in enumerate(mine):
        user, reply = items[2 * k], items[2 * k + 1]
        assert user["turn_id"] == reply["turn_id"] == turn["id"]
        assert user["content"] == turn["input"]
        assert reply["content"] == turn["output"] and reply["complete"]
    return [str(t["input"]) for t in mine]


def test_double_texting_across_workers_keeps_every_session_serial(
    launch: Callable[..., Server], fake_openai: FakeOpenAIServer
) -> None:
    srv = launch(env={"FAKE_OPENAI_URL": fake_openai.base_url})
    per_session = 10
    # Two sessions on a scripted model that says what it saw, one on an OpenAI-compatible
    # provider (a real HTTP call from each worker), all three at once.
    turns = double_text(srv, ["echo", "echo", "upstream"], per_session)
    for sid in ("dt0", "dt1"):
        order = check_serial(srv, sid, turns, per_session)
        for k, turn in enumerate(
            sorted((t for t in turns if t["session_id"] == sid), key=lambda t: int(str(t["seq"])))
        ):
            # Each turn's model request saw exactly the turns accepted before it.
            assert turn["output"] == f"saw [{', '.join(order[:k])}] then {order[k]}"
    order = check_serial(srv, "dt2", turns, per_session)
    seen = [
        [m["content"] for m in body["messages"] if m["role"] == "user"]
        for body in fake_openai.chat_requests
        if any(
            m["role"] == "user" and str(m["content"]).startswith("dt2-") for m in body["messages"]
        )
    ]
    assert sorted(seen, key=len) == [order[: k + 1] for k in range(per_session)]


def test_double_texting_across_workers_on_postgres(
    launch: Callable[..., Server], postgres_url: str
) -> None:
    srv = launch("--store", postgres_url)
    per_session = 10
    turns = double_text(srv, ["echo", "echo"], per_session)
    for sid in ("dt0", "dt1"):
        order = check_serial(srv, sid, turns, per_session)
        replies = [
            t["output"]
            for t in sorted(
                (t for t in turns if t["session_id"] == sid), key=lambda t: int(str(t["seq"]))
            )
        ]
        assert replies == [
            f"saw [{', '.join(order[:k])}] then {order[k]}" for k in range(per_session)
        ]


# -- a worker dies, the parent stops ------------------------------------------------------------
def test_kill_9_of_a_worker_restarts_it_and_its_turn_ends_recorded(
    launch: Callable[..., Server],
) -> None:
    srv = launch()
    db = srv.data_dir / "tether.db"
    before = workers_of(srv.proc.pid)
    with fresh(srv) as c:
        assert c.post("/v1/sessions", json={"agent": "slow", "session_id": "k"}).status_code == 201
        doomed = c.post("/v1/sessions/k/turns", json={"input": "one", "wait": False}).json()
        wait_status(c, "k", doomed["id"], {"running"}, 10)
        # The lease's owner id names the worker running the turn: node|host|pid|nonce.
        row = stored(db, "SELECT lease_owner FROM sessions WHERE session_id = 'k'")
        assert row is not None and isinstance(row[0], str), row
        node, _, pid_text, _ = row[0].split("|")
        pid = int(pid_text)
        assert pid in before and node in NODES
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()

        lost = wait_status(c, "k", doomed["id"], TERMINAL, 15)
        # Recorded, and well before the lease (30 s) would have run out: the worker that took
        # the session saw that the lease's process is gone.
        assert (lost["status"], lost["reason"]) == ("failed", "owner_lost")
        assert time.monotonic() - killed_at < 10

        wait_for(lambda: len(workers_of(srv.proc.pid)) == 2, 15, srv, "no worker started again")
        now = workers_of(srv.proc.pid)
        assert pid not in now and len(now & before) == 1
        assert nodes_answering(srv, NODES) == NODES  # the new one under the same node name
        after = c.post("/v1/sessions/k/turns", json={"input": "two"}).json()
        assert after["status"] == "completed"
        items = c.get("/v1/sessions/k/items").json()["data"]
        assert [i["content"] for i in items if i["kind"] == "user"] == ["one", "two"]
        assert all(
            not i["complete"]
            for i in items
            if i["turn_id"] == doomed["id"] and i["kind"] == "assistant"
        )
    assert srv.proc.poll() is None
    log = srv.output()
    assert f"worker {node} (pid {pid}) died (killed by SIGKILL); starting it again" in log, log
    assert log.count(BANNER) == 1, log


SCRIPT = """
import sys
from tether import Agent, App
from tether.testing import ScriptedModel, Slow, reply_to

# Defined in __main__: the workers are forked, so they have these without importing anything.
agents = [
    Agent(name="greeter", model=ScriptedModel(default=reply_to), memory={"auto": False}),
    Agent(name="slow", model=ScriptedModel(default=Slow(" ".join(["w"] * 30), delay=0.05))),
]
App(agents=agents).serve(port=int(sys.argv[1]), data_dir=sys.argv[2], workers=2,
                         drain_timeout=10, log_level="warning")
"""


def test_sigterm_to_the_parent_drains_every_worker_and_leaves_none(tmp_path: Path) -> None:
    script = tmp_path / "myapp.py"
    script.write_text(SCRIPT)
    port, data = free_port(), tmp_path / "data"
    log = tmp_path / "out.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(port), str(data)],
            cwd=tmp_path,
            env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    srv = Server(proc, f"http://127.0.0.1:{port}", data, log)
    try:
        wait_for(lambda: _ready(srv), 30, srv, "not ready")
        assert nodes_answering(srv, NODES) == NODES
        pids = workers_of(proc.pid)
        assert len(pids) == 2, pids
        with fresh(srv) as c:
            assert (
                c.post("/api/chat", json={"message": "hi", "agent_name": "greeter"}).json()[
                    "response"
                ]
                == "reply to: hi"
            )
            c.post("/v1/sessions", json={"agent": "slow", "session_id": "d"})
            running = c.post("/v1/sessions/d/turns", json={"input": "go", "wait": False}).json()
            wait_status(c, "d", running["id"], {"running"}, 10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, srv.output()
        assert not [pid for pid in pids if alive(pid)]
        # The running turn (1.5 s) was drained to its end, not cut off.
        row = stored(
            data / "tether.db", "SELECT status, reason FROM turns WHERE id = ?", running["id"]
        )
        assert row == ("completed", "answered"), row
        assert "Traceback" not in srv.output()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _ready(srv: Server) -> bool:
    if srv.proc.poll() is not None:
        raise AssertionError(f"exited {srv.proc.returncode}:\n{srv.output()}")
    try:
        return httpx.get(srv.url + "/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


# -- failing to start ----------------------------------------------------------------------------
SERVE = [sys.executable, "-m", "tether", "serve", "tests.server.apps:app", "--workers", "2"]


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [*SERVE, "--port", str(free_port()), "--data-dir", str(tmp_path / "data"), *args],
        cwd=ROOT,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr


def test_workers_that_cannot_start_exit_3_and_a_bad_setting_2(tmp_path: Path) -> None:
    # The store cannot be opened (a directory): found by the parent, before any fork.
    code, output = _serve(tmp_path, "--store", str(tmp_path))
    assert code == 3, output
    assert "cannot open the store" in output and BANNER not in output
    # A setting only the app checks as it is built: each worker refuses it, as one process does.
    code, output = _serve(tmp_path, env={"TETHER_AUTO_NOTES": "bogus"})
    assert code == 2, output
    assert "TETHER_AUTO_NOTES='bogus'" in output and "failed to start" in output
    assert BANNER not in output and "Traceback" not in output


OPEN = """
import asyncio, sys, time
from tether.store.sqlite import SQLiteStore

async def main() -> None:
    store = SQLiteStore(sys.argv[1])
    while time.time() < float(sys.argv[2]):
        pass
    await store.open()
    await store.close()

asyncio.run(main())
"""


def test_processes_opening_one_fresh_sqlite_file_at_once_take_turns(tmp_path: Path) -> None:
    """Without the parent's migration too: the migrations' BEGIN IMMEDIATE (and the busy
    timeout) make processes that open a fresh file together wait for each other."""
    db = tmp_path / "fresh" / "tether.db"
    start = time.time() + 3  # after every interpreter has started
    env = {"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, str(db), str(start)], env=env, stderr=subprocess.PIPE
        )
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=60)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    row = stored(db, "SELECT COUNT(*), COUNT(DISTINCT version) FROM schema_version")
    assert row is not None and row[0] == row[1], row
