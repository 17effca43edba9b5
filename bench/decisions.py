"""Human decisions (issue 11): how soon a decision runs the tool, and what parked turns cost.

Reproduce (from the repository root; PostgreSQL on 127.0.0.1:5432, trust auth, user postgres)::

    .venv/bin/python bench/decisions.py              # SQLite and PostgreSQL, ~2 min on 2 cores
    .venv/bin/python bench/decisions.py --trials 20 --parked 50

``tests.server.apps:app`` in real ``tether serve`` processes; its ``counter`` agent asks before
each launch, and its tool appends ``node target time`` to a log file every process shares.

1. **Decision → tool**: a turn is started on node A (``POST …/turns``, which answers 202 once
   the turn waits for its approval), the approval is posted to node B, and the time from sending
   the decision to the tool's own clock reading when it ran is taken (same machine, one clock).
   PostgreSQL: two nodes on one database; SQLite: one server (A = B). ``--trials`` each.
2. **Others while many wait**: 32 client sessions send ``echo`` turns for ``--seconds`` and
   turns/s is counted, with no session waiting, then with ``--parked`` sessions parked on a
   decision (nobody decides), then with none again (the decisions denied), after a warm-up
   round: the ratio of "while waiting" to the mean of the two others says what the waiting
   ones cost the others (1.00 = nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import serve

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


@contextlib.contextmanager
def _database() -> Iterator[str]:
    import asyncpg  # type: ignore[import-untyped]

    name = f"tether_bench_decisions_{os.getpid()}"

    async def run(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_BASE + name
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _ran_at(log: Path, target: str, within: float = 30.0) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if log.exists():
            for line in log.read_text().splitlines():
                _, name, at = line.split()
                if name == target:
                    return float(at)
        time.sleep(0.001)
    raise SystemExit(f"the tool never ran for {target}")


def _park(c: httpx.Client, sid: str, text: str) -> tuple[str, str]:
    c.post("/v1/sessions", json={"agent": "counter", "session_id": sid}).raise_for_status()
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": text})
    if r.status_code != 202:
        raise SystemExit(f"expected the turn to wait for approval: {r.status_code} {r.text}")
    turn = r.json()
    return turn["id"], turn["decisions"][0]["call_id"]


def decision_latency(a: str, b: str, log: Path, trials: int, tag: str) -> list[float]:
    out: list[float] = []
    with httpx.Client(base_url=a, timeout=60) as ca, httpx.Client(base_url=b, timeout=60) as cb:
        for n in range(trials):
            sid, target = f"{tag}-lat-{n}", f"{tag}-t{n}"
            tid, call_id = _park(ca, sid, target)
            time.sleep(0.3)  # past the worker's linger: the lease is given up, as in real use
            sent = time.time()
            r = cb.post(
                f"/v1/sessions/{sid}/turns/{tid}/decisions",
                json={"call_id": call_id, "decision": "approve"},
            )
            r.raise_for_status()
            out.append((_ran_at(log, target) - sent) * 1000)
    return out


async def _throughput(url: str, seconds: float, tag: str) -> float:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        stop = time.monotonic() + seconds
        counts = [0] * 32

        async def worker(w: int) -> None:
            sid = f"{tag}-w{w}"
            await client.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
            n = 0
            while time.monotonic() < stop:
                r = await client.post(f"/v1/sessions/{sid}/turns", json={"input": f"m{n}"})
                r.raise_for_status()
                counts[w] += 1
                n += 1
                # The echo agent shows every earlier message: start a fresh session now and
                # then so the prompt stays short and rounds stay comparable.
                if n % 50 == 0:
                    sid = f"{tag}-w{w}-{n}"
                    await client.post("/v1/sessions", json={"agent": "echo", "session_id": sid})

        start = time.monotonic()
        await asyncio.gather(*(worker(w) for w in range(32)))
        return sum(counts) / (time.monotonic() - start)


def others_while_waiting(url: str, parked: int, seconds: float, tag: str) -> list[float]:
    asyncio.run(_throughput(url, min(seconds, 3.0), f"{tag}-warm"))  # not counted
    rates = [asyncio.run(_throughput(url, seconds, f"{tag}-none"))]
    waiting: list[tuple[str, str, str]] = []
    with httpx.Client(base_url=url, timeout=60) as c:
        for n in range(parked):
            sid = f"{tag}-parked-{n}"
            tid, call_id = _park(c, sid, f"{tag}-p{n}")
            waiting.append((sid, tid, call_id))
        rates.append(asyncio.run(_throughput(url, seconds, f"{tag}-parked")))
        for sid, tid, call_id in waiting:
            c.post(
                f"/v1/sessions/{sid}/turns/{tid}/decisions",
                json={"call_id": call_id, "decision": "deny"},
            ).raise_for_status()
    rates.append(asyncio.run(_throughput(url, seconds, f"{tag}-after")))
    return rates


def report(name: str, latencies: list[float], rates: list[float]) -> None:
    p50, p99 = _percentile(latencies, 0.5), _percentile(latencies, 0.99)
    print(f"{name}: decision → tool running, {len(latencies)} trials")
    print(f"  p50 {p50:.1f} ms   p99 {p99:.1f} ms   max {max(latencies):.1f} ms")
    none = statistics.mean([rates[0], rates[2]])
    print(
        f"  others' turns/s: none waiting {rates[0]:.0f} / {rates[2]:.0f} (before / after),"
        f" while waiting {rates[1]:.0f}  → ratio {rates[1] / none:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--parked", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        log = tmp / "launches.log"
        os.environ["LAUNCH_LOG"] = str(log)
        os.environ["TETHER_TEST_DECISION_TIMEOUT"] = "600"
        # Quiet per-principal bounds: 100 parked sessions and 32 busy ones are one principal.
        os.environ["TETHER_MAX_RUNNING_TURNS"] = "off"
        with serve(tmp / "sqlite", tmp / "sqlite.log") as url:
            lat = decision_latency(url, url, log, args.trials, "sq")
            rates = others_while_waiting(url, args.parked, args.seconds, "sq")
        report("SQLite, one server", lat, rates)
        if args.no_postgres:
            return
        with _database() as pg:
            with (
                serve(tmp / "a", tmp / "a.log", "--store", pg) as a,
                serve(tmp / "b", tmp / "b.log", "--store", pg) as b,
            ):
                lat = decision_latency(a, b, log, args.trials, "pg")
                rates = others_while_waiting(a, args.parked, args.seconds, "pg")
            report("PostgreSQL, asked on A, decided on B", lat, rates)


if __name__ == "__main__":
    main()
