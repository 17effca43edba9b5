"""Several ``tether serve`` processes on one PostgreSQL database: throughput, cancel, fail-over.

Reproduce (from the repository root; PostgreSQL on 127.0.0.1:5432, trust auth, user postgres)::

    .venv/bin/python bench/multinode.py            # full run, < 3 min on 2 cores
    .venv/bin/python bench/multinode.py --quick    # smoke test, ~1 min

Every database is a fresh ``tether_bench_<pid>_<n>`` on 127.0.0.1, dropped at the end.

1. **Throughput**: 64 concurrent sessions (one worker and one keep-alive connection per node
   each), ``POST /v1/sessions/{sid}/turns`` one after the other, against the default agent on
   the fake OpenAI model of ``bench/http_load.py`` (``TCP_NODELAY``, 40-word answer streamed a
   word at a time) at 0 ms and 50 ms latency. Three set-ups: 1 process on SQLite, 1 process on
   PostgreSQL, 3 processes on PostgreSQL; with 3 nodes each worker sends its turns to the nodes
   in turn (turn ``n`` of worker ``w`` goes to node ``(w + n) % 3``), as a round-robin load
   balancer would. CPU from ``/proc`` for every tether process, the fake model and this one.
2. **Cross-node cancel**: ``tests.server.apps:app`` on 2 nodes; a ``slow`` turn (40 words,
   50 ms apart) started with ``wait=false`` on node A; once it is ``running`` (polled every
   5 ms), ``POST .../cancel`` to node B and poll ``GET`` of the turn on B every 5 ms until it
   is ``cancelled``: the time from sending the cancel to that GET.
3. **Fail-over**: 2 nodes with ``TETHER_LEASE_TTL=2``; a ``slow`` turn running on A, a second
   turn queued through B, ``kill -9`` A, poll the queued turn on B every 10 ms until it is
   ``running`` or ``completed``. A restarts for every trial.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import asyncpg  # type: ignore[import-untyped]
import httpx
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _serve import cpu_seconds
from http_load import (
    MODEL,
    QUESTION,
    _fail,
    _load,
    _stop,
    _wait_ready,
    console,
    free_port,
)

ROOT = Path(__file__).resolve().parents[1]
HTTP_LOAD = Path(__file__).resolve().parent / "http_load.py"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"
SESSIONS = 64
LATENCIES_MS = (0, 50)
RATIO_TARGET = 1.5
CANCEL_P99_TARGET_MS = 100.0
LEASE_TTL = 2.0


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def postgres_cpu() -> dict[int, float]:
    """CPU seconds of every process named ``postgres`` (the server and its backends)."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != "postgres":
                    continue
            out[int(entry)] = cpu_seconds(int(entry))
    return out


def host_busy() -> float:
    """CPU seconds the whole host spent not idle (``/proc/stat``, all cores)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


# -- PostgreSQL ----------------------------------------------------------------------------------
class Databases:
    """Fresh databases on 127.0.0.1, all dropped by :meth:`drop_all`."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def new(self) -> str:
        name = f"tether_bench_{os.getpid()}_{len(self.names)}"
        asyncio.run(self._exec(f'CREATE DATABASE "{name}"'))
        self.names.append(name)
        return PG_BASE + name

    def drop_all(self) -> None:
        for name in self.names:
            with contextlib.suppress(Exception):
                asyncio.run(self._exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self.names.clear()

    @staticmethod
    async def _exec(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


# -- processes -----------------------------------------------------------------------------------
@dataclass
class Node:
    proc: subprocess.Popen[bytes]
    url: str
    log: IO[bytes]


class Cluster:
    """Every subprocess this benchmark starts; :meth:`close` kills whatever is left."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
        self.logs: list[IO[bytes]] = []

    def fake(self, latency_ms: int) -> tuple[subprocess.Popen[str], str]:
        log = self._log()
        proc = subprocess.Popen(
            [sys.executable, str(HTTP_LOAD), "--serve-fake", str(latency_ms)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self.procs.append(proc)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("listening on "):
            raise _fail("the fake OpenAI server did not start", log)
        return proc, line.removeprefix("listening on ").strip()

    def node(
        self, name: str, store: str | None, env: dict[str, str], target: str | None = None
    ) -> Node:
        """Start ``tether serve`` (not waiting for it: see :meth:`ready`)."""
        port = free_port()
        data_dir = self.tmp / f"{name}-{port}"
        full = {k: v for k, v in os.environ.items() if not k.startswith("TETHER_")}
        full |= {"PYTHONPATH": str(ROOT), "NO_PROXY": "127.0.0.1,localhost", **env}
        cmd = [sys.executable, "-m", "tether", "serve"]
        if target:
            cmd.append(target)
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
        cmd += ["--log-level", "warning", "--node", name]
        if store:
            cmd += ["--store", store]
        log = self._log()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.DEVNULL, stderr=log)
        self.procs.append(proc)
        return Node(proc, f"http://127.0.0.1:{port}", log)

    @staticmethod
    def ready(nodes: Sequence[Node]) -> None:
        for n in nodes:
            _wait_ready(n.proc, f"{n.url}/readyz", n.log)

    def _log(self) -> IO[bytes]:
        log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.logs.append(log)
        return log

    def stop(self, procs: Sequence[subprocess.Popen[bytes] | subprocess.Popen[str]]) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            _stop(p)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        for log in self.logs:
            log.close()


# -- 1. throughput -------------------------------------------------------------------------------
@dataclass
class Run:
    setup: str
    latency_ms: int
    turns: int
    wall: float
    latencies: list[float]
    errors: int
    tether_cpu: float
    fake_cpu: float
    client_cpu: float
    pg_cpu: float
    host_cpu: float

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall if self.wall else math.inf

    @property
    def busy_cores(self) -> float:
        return (self.tether_cpu + self.fake_cpu + self.client_cpu + self.pg_cpu) / self.wall


async def drive(
    nodes: Sequence[Node],
    fake_pid: int,
    setup: str,
    latency_ms: int,
    turns_each: int,
    sticky: bool,
) -> Run:
    urls = [n.url for n in nodes]
    errors: Counter[str] = Counter()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        pool = [
            [
                await stack.enter_async_context(
                    httpx.AsyncClient(limits=limits, timeout=120, trust_env=False)
                )
                for _ in urls
            ]
            for _ in range(SESSIONS)
        ]

        async def turn(w: int, n: int) -> bool:
            k = (w if sticky else w + n) % len(urls)
            try:
                r = await pool[w][k].post(
                    f"{urls[k]}/v1/sessions/mn-{w}/turns", json={"input": QUESTION.format(n=n)}
                )
            except httpx.HTTPError as exc:
                errors[f"{type(exc).__name__}: {exc}"] += 1
                return False
            if r.status_code == 200 and r.json().get("status") == "completed":
                return True
            errors[f"HTTP {r.status_code} {r.text[:200]}"] += 1
            return False

        async def set_up(w: int) -> None:
            r = await pool[w][0].post(f"{urls[0]}/v1/sessions", json={"session_id": f"mn-{w}"})
            r.raise_for_status()
            for n in range(len(urls)):  # warm-up: one turn through every node
                await turn(w, -1 - n)

        async def work(w: int, out: list[float]) -> None:
            for n in range(turns_each):
                start = time.perf_counter()
                if await turn(w, n):
                    out.append(time.perf_counter() - start)

        await asyncio.gather(*(set_up(w) for w in range(SESSIONS)))
        errors.clear()
        outs: list[list[float]] = [[] for _ in range(SESSIONS)]
        pids = [n.proc.pid for n in nodes]
        tether0 = sum(cpu_seconds(p) for p in pids)
        pg0, host0 = postgres_cpu(), host_busy()
        fake0, client0, wall0 = cpu_seconds(fake_pid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(work(w, outs[w]) for w in range(SESSIONS)))
        wall = time.perf_counter() - wall0
        client_cpu = time.process_time() - client0
        tether_cpu = sum(cpu_seconds(p) for p in pids) - tether0
        fake_cpu = cpu_seconds(fake_pid) - fake0
        pg1, host_cpu = postgres_cpu(), host_busy() - host0
    pg_cpu = sum(cpu - pg0.get(pid, 0.0) for pid, cpu in pg1.items())
    for error, count in errors.most_common(3):
        console.print(f"[red]  {count} x {error}[/]")
    latencies = [x for out in outs for x in out]
    return Run(
        setup=setup,
        latency_ms=latency_ms,
        turns=SESSIONS * turns_each,
        wall=wall,
        latencies=latencies,
        errors=SESSIONS * turns_each - len(latencies),
        tether_cpu=tether_cpu,
        fake_cpu=fake_cpu,
        client_cpu=client_cpu,
        pg_cpu=pg_cpu,
        host_cpu=host_cpu,
    )


# (label, store, nodes, sticky): sticky pins session w to node w % 3 instead of round-robin.
SETUPS: tuple[tuple[str, str, int, bool], ...] = (
    ("1 x SQLite", "sqlite", 1, False),
    ("1 x PostgreSQL", "postgres", 1, False),
    ("3 x PostgreSQL", "postgres", 3, False),
    ("3 x PG, sticky", "postgres", 3, True),
)


def throughput(cluster: Cluster, dbs: Databases, turns_each: int) -> list[Run]:
    runs: list[Run] = []
    for latency in LATENCIES_MS:
        fake, fake_url = cluster.fake(latency)
        env = {
            "TETHER_MODEL": f"openai:{MODEL}",
            "OPENAI_BASE_URL": fake_url,
            "OPENAI_API_KEY": "x",
        }
        try:
            for label, kind, count, sticky in SETUPS:
                store = dbs.new() if kind == "postgres" else None
                nodes = [cluster.node(f"n{i}", store, env) for i in range(count)]
                try:
                    cluster.ready(nodes)
                    run = asyncio.run(drive(nodes, fake.pid, label, latency, turns_each, sticky))
                finally:
                    cluster.stop([n.proc for n in nodes])
                runs.append(run)
                console.print(
                    f"  {latency:>2} ms {label:<15}: {run.turns_per_s:6,.0f} turns/s, p99 "
                    f"{1000 * pct(run.latencies, 0.99):6.1f} ms, busy cores "
                    f"{run.busy_cores:.2f}",
                    style="dim",
                )
        finally:
            cluster.stop([fake])
    return runs


def throughput_table(runs: list[Run]) -> Table:
    table = Table(title=f"Throughput, {SESSIONS} concurrent sessions, /v1 turns")
    cols: tuple[str, ...] = ("model", "set-up", "turns", "turns/s", "x 1 PG", "p50 ms", "p99 ms")
    cols += ("tether CPU ms/turn", "model CPU ms/turn", "client CPU ms/turn")
    cols += ("PG CPU ms/turn", "busy cores", "host busy", "err")
    for col in cols:
        table.add_column(col, justify="left" if col == "set-up" else "right")
    for r in runs:
        base = next(b for b in runs if b.latency_ms == r.latency_ms and b.setup == SETUPS[1][0])
        table.add_row(
            f"{r.latency_ms} ms",
            r.setup,
            str(r.turns),
            f"{r.turns_per_s:,.0f}",
            f"{r.turns_per_s / base.turns_per_s:.2f}",
            f"{1000 * pct(r.latencies, 0.5):.1f}",
            f"{1000 * pct(r.latencies, 0.99):.1f}",
            f"{1000 * r.tether_cpu / r.turns:.2f}",
            f"{1000 * r.fake_cpu / r.turns:.2f}",
            f"{1000 * r.client_cpu / r.turns:.2f}",
            f"{1000 * r.pg_cpu / r.turns:.2f}",
            f"{r.busy_cores:.2f}",
            f"{r.host_cpu / r.wall:.2f}",
            str(r.errors) if r.errors else "",
            end_section=r.setup == SETUPS[-1][0],
        )
    return table


# -- 2. cross-node cancel ------------------------------------------------------------------------
def poll(
    c: httpx.Client, sid: str, tid: str, want: set[str], every: float, within: float
) -> dict[str, object]:
    deadline = time.monotonic() + within
    while True:
        state: dict[str, object] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if state["status"] in want:
            return state
        if time.monotonic() > deadline:
            raise RuntimeError(f"turn {tid} still {state['status']} after {within} s")
        time.sleep(every)


def cancel_latency(cluster: Cluster, dbs: Databases, trials: int) -> list[float]:
    store = dbs.new()
    nodes = [cluster.node(f"c{i}", store, {}, "tests.server.apps:app") for i in range(2)]
    took: list[float] = []
    try:
        cluster.ready(nodes)
        with (
            httpx.Client(base_url=nodes[0].url, timeout=30, trust_env=False) as ca,
            httpx.Client(base_url=nodes[1].url, timeout=30, trust_env=False) as cb,
        ):
            for i in range(trials + 1):  # the first is a warm-up
                sid = f"cancel-{i}"
                ca.post("/v1/sessions", json={"agent": "slow", "session_id": sid})
                r = ca.post(f"/v1/sessions/{sid}/turns", json={"input": "go", "wait": False})
                tid = str(r.json()["id"])
                poll(ca, sid, tid, {"running"}, 0.005, 10)
                start = time.perf_counter()
                cb.post(f"/v1/sessions/{sid}/turns/{tid}/cancel")
                poll(cb, sid, tid, {"cancelled"}, 0.005, 10)
                if i:
                    took.append(time.perf_counter() - start)
    finally:
        cluster.stop([n.proc for n in nodes])
    return took


# -- 3. fail-over --------------------------------------------------------------------------------
@dataclass
class Failover:
    took: float
    started: str
    doomed: str


def failover(cluster: Cluster, dbs: Databases, trials: int) -> list[Failover]:
    store = dbs.new()
    env = {"TETHER_LEASE_TTL": str(int(LEASE_TTL))}
    app = "tests.server.apps:app"
    b = cluster.node("fb", store, env, app)
    out: list[Failover] = []
    try:
        cluster.ready([b])
        for i in range(trials):
            a = cluster.node(f"fa{i}", store, env, app)
            try:
                cluster.ready([a])
                with (
                    httpx.Client(base_url=a.url, timeout=30, trust_env=False) as ca,
                    httpx.Client(base_url=b.url, timeout=30, trust_env=False) as cb,
                ):
                    sid = f"fail-{i}"
                    ca.post("/v1/sessions", json={"agent": "slow", "session_id": sid})
                    r = ca.post(f"/v1/sessions/{sid}/turns", json={"input": "one", "wait": False})
                    doomed = str(r.json()["id"])
                    poll(ca, sid, doomed, {"running"}, 0.01, 10)
                    r = cb.post(f"/v1/sessions/{sid}/turns", json={"input": "two", "wait": False})
                    queued = str(r.json()["id"])
                    a.proc.kill()
                    killed = time.perf_counter()
                    state = poll(cb, sid, queued, {"running", "completed"}, 0.01, LEASE_TTL + 10)
                    took = time.perf_counter() - killed
                    lost = cb.get(f"/v1/sessions/{sid}/turns/{doomed}").json()
                    out.append(
                        Failover(took, str(state["status"]), f"{lost['status']}/{lost['reason']}")
                    )
                    poll(cb, sid, queued, {"completed"}, 0.05, 30)
            finally:
                a.proc.kill()
                a.proc.wait()
    finally:
        cluster.stop([b.proc])
    return out


# -- main ----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args()
    quick: bool = args.quick
    turns_each = 2 if quick else 5
    cancel_trials = 10 if quick else 30
    failover_trials = 2 if quick else 4

    command = " ".join([".venv/bin/python", "bench/multinode.py", *sys.argv[1:]])
    console.print(f"[bold]Command:[/] {command}")
    console.print(
        f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"load average {_load()} before the run. PostgreSQL on 127.0.0.1:5432."
    )
    started = time.perf_counter()
    dbs = Databases()
    with tempfile.TemporaryDirectory(prefix="tether-multinode-") as tmp:
        cluster = Cluster(Path(tmp))
        try:
            runs = throughput(cluster, dbs, turns_each)
            cancels = cancel_latency(cluster, dbs, cancel_trials)
            fails = failover(cluster, dbs, failover_trials)
        finally:
            cluster.close()
            dbs.drop_all()

    console.print(throughput_table(runs))
    console.print(
        f"Each of the {SESSIONS} workers: 1 session, 1 warm-up turn per node, then {turns_each} "
        "measured turns back to back. CPU columns: CPU seconds of that process (all tether "
        "nodes summed; 'PG' = every process named postgres) over the measured window / turns; "
        "'busy cores' = all of those / wall; 'host busy' = non-idle CPU of the whole host "
        f"(/proc/stat) / wall, out of {os.cpu_count()} cores. '3 x PostgreSQL' sends each "
        "worker's turns to the nodes in turn; 'sticky' pins each session to one node."
    )

    t = Table(title="Cross-node cancel and fail-over")
    for col in ("what", "trials", "p50 ms", "p99 / max ms", "target", ""):
        t.add_column(col, justify="left" if col == "what" else "right")
    c99 = 1000 * pct(cancels, 0.99)
    t.add_row(
        "cancel on B of a turn running on A -> GET on B says cancelled",
        str(len(cancels)),
        f"{1000 * pct(cancels, 0.5):.1f}",
        f"{c99:.1f}",
        f"p99 <= {CANCEL_P99_TARGET_MS:.0f}",
        verdict(c99 <= CANCEL_P99_TARGET_MS),
    )
    took = [f.took for f in fails]
    worst = max(took) if took else math.nan
    limit = LEASE_TTL + 1
    t.add_row(
        f"kill -9 of A -> turn queued via B running (TETHER_LEASE_TTL={LEASE_TTL:.0f})",
        str(len(fails)),
        f"{1000 * pct(took, 0.5):.1f}",
        f"{1000 * worst:.1f}",
        f"<= {1000 * limit:.0f}",
        verdict(worst <= limit),
    )
    console.print(t)
    for f in fails:
        console.print(
            f"  fail-over trial: {1000 * f.took:.0f} ms, queued turn seen {f.started}, "
            f"killed turn {f.doomed}",
            style="dim",
        )

    console.print("\n[bold]Targets[/]")
    for latency in LATENCIES_MS:
        one = next(r for r in runs if r.latency_ms == latency and r.setup == SETUPS[1][0])
        three = next(r for r in runs if r.latency_ms == latency and r.setup == SETUPS[2][0])
        sticky = next(r for r in runs if r.latency_ms == latency and r.setup == SETUPS[3][0])
        ratio = three.turns_per_s / one.turns_per_s
        target = (
            f"(target >= {RATIO_TARGET}) {verdict(ratio >= RATIO_TARGET)}" if not latency else ""
        )
        console.print(
            f"  {latency} ms: 3 PG nodes / 1 PG node = {ratio:.2f} x {target} (sticky "
            f"{sticky.turns_per_s / one.turns_per_s:.2f} x); host busy "
            f"{one.host_cpu / one.wall:.2f} -> {three.host_cpu / three.wall:.2f} of "
            f"{os.cpu_count()} cores, tether CPU/turn {1000 * one.tether_cpu / one.turns:.1f} -> "
            f"{1000 * three.tether_cpu / three.turns:.1f} ms"
        )
    console.print(
        f"  cancel p99 {c99:.1f} ms (target <= {CANCEL_P99_TARGET_MS:.0f}) "
        f"{verdict(c99 <= CANCEL_P99_TARGET_MS)}; fail-over worst {1000 * worst:.0f} ms "
        f"(target <= lease {LEASE_TTL:.0f} s + 1 s) {verdict(worst <= limit)}"
    )
    console.print(f"\nTotal {time.perf_counter() - started:.0f} s; load average {_load()}")


if __name__ == "__main__":
    main()
