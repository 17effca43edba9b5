"""What the per-principal bounds cost a turn's admission (issue 10, item 8).

Reproduce (from the repository root)::

    .venv/bin/python bench/admission.py                  # SQLite, an owner with 1,000 sessions
    .venv/bin/python bench/admission.py --sessions 10000
    .venv/bin/python bench/admission.py --store postgresql://postgres@127.0.0.1:5432/bench
    .venv/bin/python bench/admission.py --others 10000   # other users' turns under way

An owner keeps ``--sessions`` sessions, and ``--others`` other users have a turn queued each;
turns are admitted (``enqueue_turn``) and cancelled in the queue on 500 of the owner's sessions,
alternately without bounds (in-process callers) and with the server's defaults, four rounds
each, interleaved so the machine's noise falls on both alike. Printed: CPU
microseconds per admit-and-cancel (this process's CPU: SQLite's work runs on its thread here),
wall microseconds (which include PostgreSQL's work), and the ratios with/without.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from tether.records import PrincipalLimits, SessionKey
from tether.server.settings import DEFAULT_PRINCIPAL_LIMITS
from tether.store import open_store_url
from tether.store.protocol import Store

ROUNDS = 4
TURNS = 500


async def measure(store: Store, sessions: int, others: int = 0) -> dict[str, list[float]]:
    keys = [SessionKey("bench", "owner", f"s{i}") for i in range(sessions)]
    for k in keys:
        await store.create_session(k, "a", exist_ok=True)
    for i in range(others):
        # Turns of other users under way (or waiting): not the owner's to count.
        other = SessionKey("bench", f"other-{i}", "s")
        _, made = await store.create_session(other, "a", exist_ok=True)
        if made:
            await store.enqueue_turn(other, turn_id=f"other-{i}", input="x", policy="enqueue")
    ids = itertools.count()
    admitted = keys[:TURNS]
    out: dict[str, list[float]] = {"without": [], "with": [], "without wall": [], "with wall": []}
    for _ in range(ROUNDS):
        for label, limits in (("without", None), ("with", DEFAULT_PRINCIPAL_LIMITS)):
            bounds: PrincipalLimits | None = limits
            start, wall = time.process_time(), time.perf_counter()
            for k in admitted:
                turn_id = f"t-{next(ids)}"
                await store.enqueue_turn(
                    k, turn_id=turn_id, input="x", policy="enqueue", limits=bounds
                )
                await store.end_waiting_turn(k, turn_id, "cancelled")
            out[label].append((time.process_time() - start) / len(admitted) * 1e6)
            out[f"{label} wall"].append((time.perf_counter() - wall) / len(admitted) * 1e6)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument(
        "--others", type=int, default=0, help="other users with a turn queued (default 0)"
    )
    parser.add_argument("--store", help="a postgresql:// URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store_url(args.store or str(Path(tmp) / "bench.db"))
        await store.open()
        try:
            got = await measure(store, args.sessions, args.others)
        finally:
            await store.close()
    med = {label: statistics.median(values) for label, values in got.items()}
    admitted = min(TURNS, args.sessions)
    print(
        f"owner with {args.sessions} sessions, {args.others} other users with a turn queued,"
        f" {admitted} admissions x {ROUNDS} rounds each:"
    )
    print("  per admit + cancel (median of rounds)    CPU us    wall us")
    for label in ("without", "with"):
        print(f"  {label + ' bounds:':<40}{med[label]:>7.0f}{med[label + ' wall']:>11.0f}")
    ratio, wall_ratio = med["with"] / med["without"], med["with wall"] / med["without wall"]
    print(f"  {'ratio:':<40}{ratio:>7.2f}{wall_ratio:>11.2f}")


if __name__ == "__main__":
    asyncio.run(main())
