"""What a server does while nothing happens, and how fast a cancel lands (issue 15).

* **Idle CPU**: ``tether serve`` (SQLite) with ``--sessions`` sessions, each with one finished
  turn, left alone for ``--seconds``: the server's CPU time over that window (``/proc``), in ms
  per second. Nothing runs, so the target is about 0.
* **Cancel latency**: a slow turn is started; once it runs, it is cancelled and the time until
  the cancel's answer (the turn ended ``cancelled``) is taken. *Same process*: the cancel goes
  to the server running the turn. *Another process*: a second server on the same SQLite file
  takes the cancel, which reaches the first through the store.

    .venv/bin/python bench/idle.py            # ~1 min on 2 cores
    .venv/bin/python bench/idle.py --quick    # smoke test
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _serve import cpu_seconds, free_port, serve


async def fill(url: str, sessions: int) -> None:
    """``sessions`` sessions of the echo agent, each with one finished turn."""
    limits = httpx.Limits(max_connections=16)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        gate = asyncio.Semaphore(16)

        async def one(n: int) -> None:
            async with gate:
                r = await c.post("/v1/sessions", json={"agent": "echo", "session_id": f"idle-{n}"})
                r.raise_for_status()
                r = await c.post(f"/v1/sessions/idle-{n}/turns", json={"input": "hello"})
                r.raise_for_status()

        await asyncio.gather(*(one(n) for n in range(sessions)))


def idle_cpu(pid: int, seconds: float) -> float:
    """The server's CPU ms per wall second over ``seconds`` of nothing."""
    before, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) * 1000 / (time.monotonic() - start)


SETTLE = 10.0
"""Seconds between the last turn and the idle window (the WAL checkpoint, the last leases)."""

BARE_APP = "async def app(scope, receive, send):\n    pass\n"


def bare_uvicorn_cpu(tmp: Path, seconds: float) -> float:
    """The same measure of a do-nothing ASGI app under uvicorn: the floor of any server."""
    (tmp / "bare_app.py").write_text(BARE_APP)
    port = free_port()
    cmd = [sys.executable, "-m", "uvicorn", "bare_app:app", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], cwd=tmp, stdout=subprocess.DEVNULL)
    try:
        time.sleep(3.0)
        return idle_cpu(proc.pid, seconds)
    finally:
        proc.terminate()
        proc.wait()


def cancel_latencies(runs_on: str, cancel_on: str, count: int, tag: str) -> list[float]:
    """Seconds from a cancel's request to its answer, for ``count`` running slow turns."""
    took: list[float] = []
    with (
        httpx.Client(base_url=runs_on, timeout=60) as a,
        httpx.Client(base_url=cancel_on, timeout=60) as b,
    ):
        for n in range(count):
            sid = f"cancel-{tag}-{n}"
            a.post("/v1/sessions", json={"agent": "slow", "session_id": sid}).raise_for_status()
            r = a.post(f"/v1/sessions/{sid}/turns", json={"input": "go", "wait": False})
            r.raise_for_status()
            tid = r.json()["id"]
            for _ in range(1000):
                if a.get(f"/v1/sessions/{sid}/turns/{tid}").json()["status"] == "running":
                    break
                time.sleep(0.005)
            start = time.perf_counter()
            done = b.post(f"/v1/sessions/{sid}/turns/{tid}/cancel").json()
            took.append(time.perf_counter() - start)
            if done["status"] != "cancelled":
                raise RuntimeError(f"the cancel did not land: {done}")
    return took


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


@dataclass
class Idle:
    """What :func:`measure` found."""

    sessions: int
    seconds: float
    idle_ms_per_s: float
    """The first server's CPU ms per wall second while nothing happens."""
    floor_ms_per_s: float | None
    """The same of a do-nothing uvicorn app (None: not measured)."""
    same: list[float]
    """Cancel latencies (s), the cancel sent to the server running the turn."""
    other: list[float]
    """Cancel latencies (s), the cancel sent to another server on the same SQLite file."""


def measure(
    sessions: int, seconds: float, cancels: int, *, floor: bool = True, settle: float = SETTLE
) -> Idle:
    """Two servers on one SQLite file: the first's idle CPU with ``sessions`` sessions, then
    ``cancels`` cancels through each; and, with ``floor``, a bare uvicorn app's idle CPU."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        db = str(base / "shared.db")
        with (
            serve(base / "a", base / "a.log", "--store", db) as a,
            serve(base / "b", base / "b.log", "--store", db) as b,
        ):
            asyncio.run(fill(a, sessions))
            time.sleep(settle)  # let lingering leases go and the last writes settle
            idle_a = idle_cpu(a.pid, seconds)
            same = cancel_latencies(a, a, cancels, "same")
            other = cancel_latencies(a, b, cancels, "other")
        bare = bare_uvicorn_cpu(base, seconds) if floor else None
    return Idle(sessions, seconds, idle_a, bare, same, other)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cancels", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="100 sessions, 5 s, 8 cancels")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.seconds, args.cancels = 100, 5.0, 8
    print(f"load average {os.getloadavg()[0]:.2f}")
    found = measure(args.sessions, args.seconds, args.cancels)
    print("\n| measure | value |\n|---|---|")
    idle = found.idle_ms_per_s
    print(f"| idle CPU, {args.sessions} sessions, {args.seconds:.0f} s | {idle:.2f} ms/s |")
    print(f"| idle CPU of a do-nothing uvicorn app (the floor) | {found.floor_ms_per_s:.2f} ms/s |")
    for name, took in (("same process", found.same), ("another process", found.other)):
        print(
            f"| cancel latency, {name} (p50 / p99 ms) | "
            f"{statistics.median(took) * 1000:.1f} / {pct(took, 0.99):.1f} |"
        )


if __name__ == "__main__":
    main()
