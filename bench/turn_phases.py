"""Where a turn's time goes in ``tether serve`` under load: the store's calls, the model's.

Reproduce (from the repository root)::

    .venv/bin/python bench/turn_phases.py             # 64 sessions, 50 ms model, ~2 min
    .venv/bin/python bench/turn_phases.py --rounds 3 --sessions 16

The fake OpenAI model (``bench/fake_model.py``) and three ``tether serve`` processes in front
of it: on SQLite as it runs (its event loop's thread and its store's thread pinned to one CPU,
:mod:`tether.affinity`), on SQLite with ``TETHER_PIN_CPU=off``, and on the in-memory store
(``TETHER_STORE=memory://``: no store thread, nothing written), loaded in turn, round after
round (each round in another order), on ``POST /v1/sessions/{sid}/turns`` (``http_load.py``'s
load). Each server runs with ``bench/_phases/sitecustomize.py``, which
times the parts of every turn from inside (tether's own functions wrapped; a few µs a turn)
and, on SQLite, the store's thread: how long a call waits for its batch, a batch's wall time
against the CPU time of the thread that ran it, and how long its answers wait for the event
loop. A part's share is its mean over the mean request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_load import Run, Servers, console, fake_model, run_load, set_model_latency, tether_serve

PHASES_DIR = Path(__file__).resolve().parent / "_phases"
SUBJECTS: dict[str, dict[str, str]] = {
    "SQLite": {},
    "SQLite, not pinned": {"TETHER_PIN_CPU": "off"},
    "in-memory": {"TETHER_STORE": "memory://"},
}
"""Each server's label and its environment besides the instrumentation's."""


@dataclass
class Subject:
    label: str
    srv: Servers
    out: Path
    runs: list[Run] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


class Window(contextlib.AbstractContextManager["Window"]):
    """The measured window's wall-clock bounds (the instrumentation stamps with time.time())."""

    start = end = 0.0

    def __enter__(self) -> Window:
        self.start = time.time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = time.time()


def samples(out: Path, window: Window) -> Iterator[tuple[str, float]]:
    if not out.exists():
        return
    for line in out.read_text().splitlines():
        for stamp, part, seconds in json.loads(line):
            if window.start <= stamp <= window.end:
                yield part, seconds


async def measure(args: argparse.Namespace) -> list[Subject]:
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tether-phases-")))
        fake, fake_url = stack.enter_context(fake_model(0))
        subjects: list[Subject] = []
        for n, (label, extra) in enumerate(SUBJECTS.items()):
            out = tmp / f"{n}.jsonl"
            path = os.pathsep.join(filter(None, [str(PHASES_DIR), os.environ.get("PYTHONPATH")]))
            env = {"PYTHONPATH": path, "TETHER_BENCH_PHASES": str(out), **extra}
            data = tmp / str(n)
            proc, url, _ = stack.enter_context(tether_serve(fake_url, data, env=env))
            subjects.append(Subject(label, Servers(fake, fake_url, proc, url, data), out))
        set_model_latency(fake_url, args.latency)
        for r in range(args.rounds):
            for s in subjects[r % len(subjects) :] + subjects[: r % len(subjects)]:
                window = Window()

                def around(w: Window = window) -> Window:
                    return w

                run = await run_load(
                    s.srv,
                    args.latency,
                    "turns",
                    args.sessions,
                    per_session=10,
                    min_turns=args.turns,
                    tag=f"r{r}-{s.out.stem}",
                    around=around,
                )
                await asyncio.sleep(1.0)  # the server writes what it timed every 0.5 s
                timed = list(samples(s.out, window))
                if not any(part == "request" for part, _ in timed):
                    # Python reports a failing sitecustomize and runs on: say so, not a table.
                    raise SystemExit(f"{s.label}: no turn was timed (see bench/_phases)")
                for part, seconds in timed:
                    s.parts[part].append(seconds)
                s.runs.append(run)
                console.print(
                    f"  round {r + 1} {s.label:<18} {run.turns_per_s:6.0f} turns/s, p50 "
                    f"{run.pct_ms(0.5):6.1f} ms, p99 {run.pct_ms(0.99):6.1f} ms, server CPU "
                    f"{run.per_turn_ms(run.server_cpu):.2f} ms/turn",
                    style="dim",
                )
        return subjects


def pct(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def report(subjects: list[Subject], args: argparse.Namespace) -> None:
    load = Table(title=f"{args.sessions} sessions, {args.latency:g} ms model (median of rounds)")
    for col in ("server", "rounds", "turns/s", "p50 ms", "p99 ms", "server CPU ms/turn"):
        load.add_column(col, justify="right")
    for s in subjects:
        med = statistics.median
        load.add_row(
            s.label,
            str(len(s.runs)),
            f"{med(r.turns_per_s for r in s.runs):,.0f}",
            f"{med(r.pct_ms(0.5) for r in s.runs):.1f}",
            f"{med(r.pct_ms(0.99) for r in s.runs):.1f}",
            f"{med(r.per_turn_ms(r.server_cpu) for r in s.runs):.2f}",
        )
    console.print(load)
    for s in subjects:
        request = statistics.fmean(s.parts["request"]) if s.parts.get("request") else math.nan
        table = Table(title=f"{s.label}: the parts of a turn, pooled over the rounds")
        for col in ("part", "count", "p50", "p90", "mean", "share of a request"):
            table.add_column(col, justify="left" if col == "part" else "right")
        for part in sorted(s.parts, key=_order):
            xs = s.parts[part]
            unit = "" if part.endswith("calls a batch") else " ms"
            scale = 1.0 if not unit else 1000.0
            share = ""
            if unit and not part.startswith(("store thread", "event loop")):
                share = f"{100 * statistics.fmean(xs) / request:.0f} %"
            table.add_row(
                part,
                f"{len(xs):,}",
                f"{scale * pct(xs, 0.5):.2f}{unit}",
                f"{scale * pct(xs, 0.9):.2f}{unit}",
                f"{scale * statistics.fmean(xs):.2f}{unit}",
                share,
            )
        console.print(table)
        wall = s.parts.get("store thread: batch, wall")
        cpu = s.parts.get("store thread: batch, CPU")
        if wall and cpu:
            console.print(
                f"The store's thread spent {100 * sum(cpu) / sum(wall):.0f} % of its batches' wall"
                " time on a CPU; the rest it waited (for the interpreter's lock, mostly: each"
                " statement hands it back)."
            )
    console.print(
        "'request' is the turn route's whole answer inside the server; 'runner' the scheduler's "
        "run of the turn (prepare, model step, end); 'store: admit' and 'store: end' the two "
        "store calls of a turn, from the event loop's side (the thread's wait and batch "
        "included)."
    )


_ORDER = (
    "request",
    "submit",
    "store: admit",
    "submit's return",
    "runner's start",
    "runner",
    "prepare",
    "model step",
    "model: send",
    "store: end",
    "runner's end",
)


def _order(part: str) -> tuple[int, str]:
    for n, prefix in enumerate(_ORDER):
        if part.startswith(prefix):
            return n, part
    return len(_ORDER), part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per server (rotated)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--latency", type=int, default=50, help="model latency, ms")
    parser.add_argument("--turns", type=int, default=1920, help="measured turns per round")
    args = parser.parse_args()
    console.print(f"Command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    console.print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} before")
    report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
