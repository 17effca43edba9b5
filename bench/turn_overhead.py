"""Runtime + store overhead of one turn, with the model taken out.

Reproduce (from the repository root)::

    .venv/bin/python bench/turn_overhead.py            # full run, < 2 min on 2 cores
    .venv/bin/python bench/turn_overhead.py --quick    # a few seconds, for a smoke test
    .venv/bin/python bench/turn_overhead.py --turns 200 --profile
    .venv/bin/python bench/turn_overhead.py --only-profile --turns 30   # cProfile, SQLite x 64

Every turn goes through the public path (``Runtime.chat``: create-or-get the session, enqueue,
lease, start, window selection, model step, end, release, wait) with a :class:`ScriptedModel` of
zero latency, so what is measured is tether's own cost: the scheduler, the turn loop and the
store. CPU time is ``time.process_time()`` over the measured turns (all threads of the process,
so the SQLite thread is included) divided by the number of turns.

The scripted answer is ~40 words, streamed a word at a time like a real model, so each turn
emits (and persists) ~40 ``message.delta`` events. Two tables:

* **Concurrency**: 1, 16 and 64 sessions, each driven by its own worker doing ``--turns`` turns
  one after the other, on SQLite (a temporary directory) and on the in-memory store (reference).
  The agent's ``context_budget`` is small and fixed, so prompts do not grow as sessions do.
* **History length**: one worker on a session whose history was pre-filled with 10 or 10,000
  items (5 or 5,000 completed turns written through the store protocol), with the agent's
  default context window and with a small fixed one (``context_budget``), which sends about the
  same prompt for both lengths and so isolates the cost of the session's length itself.

Targets: <= 1 ms CPU per turn at concurrency 64 on SQLite; 10,000 items <= 1.3x 10 items.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import math
import os
import platform
import pstats
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from tether.agent import Agent
from tether.models.base import ModelRequest
from tether.records import (
    LOCAL_PRINCIPAL,
    NewEvent,
    NewItem,
    SessionKey,
    TurnEnding,
    Usage,
    new_turn_id,
)
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.store.protocol import Store
from tether.store.rules import terminal_event_data
from tether.store.sqlite import SQLiteStore
from tether.testing.scripted import ScriptedModel, last_user_text

StoreKind = Literal["sqlite", "memory"]
STORES: tuple[StoreKind, ...] = ("sqlite", "memory")

CPU_TARGET_MS = 1.0
RATIO_TARGET = 1.3
WARMUP_TURNS = 2
# Fixed window for the "isolated" history rows: about 20 of the items below (~40 tokens each).
FIXED_CONTEXT_BUDGET = 800
# A 10-item session grows by 2 items a turn; rotating over several keeps it within 10-20 items.
SMALL_SESSION_TURNS = 5

QUESTION = "Question {n}: how does the scheduler keep exactly one running turn per session?"
ANSWER = (
    "Answer {n}: each session has one lease, a fencing token incremented on every acquisition; "
    "the worker holding it runs queued turns in order, and every write checks the token in the "
    "same transaction, so a stale worker cannot write."
)

console = Console(highlight=False, width=max(110, Console().width))


# -- results -------------------------------------------------------------------------------------
@dataclass
class Result:
    store: StoreKind
    concurrency: int
    history: int | None
    window: str
    turns: int
    wall: float
    cpu: float
    loop_cpu: float
    """CPU of the event-loop thread alone; the rest of ``cpu`` is the SQLite thread's."""
    latencies: list[float]
    prompt_messages: list[int]

    @property
    def turns_per_s(self) -> float:
        return self.turns / self.wall if self.wall else math.inf

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / self.turns

    @property
    def loop_cpu_ms(self) -> float:
        return 1000 * self.loop_cpu / self.turns

    @property
    def prompt(self) -> float:
        """Mean number of messages in the model request (system + history window + input)."""
        return sum(self.prompt_messages) / len(self.prompt_messages)

    def pct_ms(self, q: float) -> float:
        ordered = sorted(self.latencies)
        index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
        return 1000 * ordered[index]


# -- set-up --------------------------------------------------------------------------------------
class Responder:
    """The scripted model's answers: realistically sized (like the pre-filled ones).

    Also notes the size of every prompt it is sent, to show how big the history window was.
    """

    def __init__(self) -> None:
        self.prompt_messages: list[int] = []

    def __call__(self, request: ModelRequest) -> str:
        self.prompt_messages.append(len(request.messages))
        return ANSWER.format(n=len(last_user_text(request)))


def make_agent(context_budget: int | None) -> tuple[Agent, Responder]:
    responder = Responder()
    agent = Agent(
        name="bench", model=ScriptedModel(default=responder), context_budget=context_budget
    )
    return agent, responder


def make_store(kind: StoreKind, root: Path) -> Store:
    if kind == "memory":
        return InMemoryStore()
    return SQLiteStore(root / "tether.db")


async def prefill(store: Store, key: SessionKey, agent: str, items: int) -> None:
    """Write ``items`` history items as completed turns of one user and one assistant item.

    Goes through the store protocol (enqueue, start, end under one lease), so the rows are
    exactly what real turns leave behind: turns, items and events.
    """
    await store.create_session(key, agent, exist_ok=True)
    lease = await store.acquire_lease(key, "bench-prefill", 600.0)
    assert lease is not None
    for n in range(items // 2):
        turn_id = new_turn_id()
        question, answer = QUESTION.format(n=n), ANSWER.format(n=n)
        await store.enqueue_turn(key, turn_id=turn_id, input=question, policy="enqueue")
        await store.start_turn(
            lease,
            turn_id,
            [NewItem("user", question)],
            [NewEvent(2, "turn.started", {"turn_id": turn_id})],
        )
        ending = TurnEnding("completed", "answered", answer, True, usage=Usage(40, 40, 1))
        await store.end_turn(
            lease,
            turn_id,
            ending,
            [NewItem("assistant", answer, meta={"step": 1})],
            [
                NewEvent(3, "message.completed", {"text": answer, "complete": True}),
                NewEvent(4, "turn.ended", terminal_event_data(turn_id, ending)),
            ],
        )
    await store.release_lease(lease)


# -- measuring -----------------------------------------------------------------------------------
async def drive(
    rt: Runtime, agent: Agent, session_ids: list[str], turns: int, out: list[float] | None
) -> None:
    """``turns`` turns one after the other, rotating over ``session_ids``."""
    model = agent.model
    assert isinstance(model, ScriptedModel)
    for n in range(turns):
        sid = session_ids[n % len(session_ids)]
        start = time.perf_counter()
        await rt.chat(agent, QUESTION.format(n=n), session_id=sid)
        if out is not None:
            out.append(time.perf_counter() - start)
        model.requests.clear()  # ScriptedModel records every request; keep memory flat


async def run_config(
    kind: StoreKind,
    *,
    concurrency: int,
    turns: int,
    history: int | None = None,
    context_budget: int | None = None,
    profiler: cProfile.Profile | None = None,
) -> Result:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        root = Path(tmp)
        store = make_store(kind, root)
        agent, responder = make_agent(context_budget)
        async with Runtime(store, agents=[agent], data_dir=root) as rt:
            # One list of sessions per worker.
            if history is None:
                groups = [[f"c{w}"] for w in range(concurrency)]
            else:
                assert concurrency == 1
                count = 1 if history > 100 else max(1, math.ceil(turns / SMALL_SESSION_TURNS))
                groups = [[f"h{i}" for i in range(count)]]
                for sid in groups[0]:
                    key = rt.key_for(agent, sid, LOCAL_PRINCIPAL)
                    await prefill(rt.store, key, agent.name, history)
            # Warm-up: create the sessions, fill caches; not measured.
            await asyncio.gather(*(drive(rt, agent, g, WARMUP_TURNS, None) for g in groups))
            per_worker: list[list[float]] = [[] for _ in groups]
            gc.collect()
            if profiler is not None:
                profiler.enable()
            responder.prompt_messages.clear()
            cpu0, loop0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
            await asyncio.gather(
                *(
                    drive(rt, agent, g, turns, lat)
                    for g, lat in zip(groups, per_worker, strict=True)
                )
            )
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            loop_cpu = time.thread_time() - loop0
            if profiler is not None:
                profiler.disable()
            prompts = list(responder.prompt_messages)
    window = "-" if history is None else ("fixed" if context_budget else "default")
    return Result(
        store=kind,
        concurrency=concurrency,
        history=history,
        window=window,
        turns=turns * len(groups),
        wall=wall,
        cpu=cpu,
        loop_cpu=loop_cpu,
        latencies=[x for lat in per_worker for x in lat],
        prompt_messages=prompts,
    )


# -- profiling -----------------------------------------------------------------------------------
def count_store_calls(store: Store) -> Counter[str]:
    """Wrap every public coroutine method of ``store`` (on the instance) to count its calls."""
    counts: Counter[str] = Counter()

    def wrap(name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return await fn(*args, **kwargs)

        return counted

    for name in dir(type(store)):
        attr = getattr(store, name)
        if not name.startswith("_") and asyncio.iscoroutinefunction(attr):
            setattr(store, name, wrap(name, attr))
    return counts


async def store_calls_per_turn(kind: StoreKind, turns: int) -> tuple[Counter[str], int]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as tmp:
        root = Path(tmp)
        store = make_store(kind, root)
        agent, _ = make_agent(FIXED_CONTEXT_BUDGET)
        async with Runtime(store, agents=[agent], data_dir=root) as rt:
            await drive(rt, agent, ["calls"], WARMUP_TURNS, None)
            counts = count_store_calls(store)
            await drive(rt, agent, ["calls"], turns, None)
            measured = Counter(counts)  # before closing the runtime adds its own calls
    return measured, turns


def profile(turns: int) -> None:
    console.print("\n[bold]Profile: SQLite, concurrency 64 (cProfile, event-loop thread only)[/]")
    profiler = cProfile.Profile()
    asyncio.run(
        run_config(
            "sqlite",
            concurrency=64,
            turns=turns,
            context_budget=FIXED_CONTEXT_BUDGET,
            profiler=profiler,
        )
    )
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(r"/tether/", 25)
    console.print(out.getvalue(), markup=False)
    counts, n = asyncio.run(store_calls_per_turn("sqlite", 50))
    table = Table(title="Store calls per turn (SQLite, one session)")
    table.add_column("method")
    table.add_column("calls/turn", justify="right")
    for name, c in counts.most_common():
        table.add_row(name, f"{c / n:.2f}")
    table.add_row("[bold]total[/]", f"[bold]{sum(counts.values()) / n:.2f}[/]")
    console.print(table)


# -- report --------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "[green]PASS[/]" if ok else "[red]FAIL[/]"


def concurrency_table(results: list[Result]) -> Table:
    table = Table(title="Turn overhead by concurrency (0-latency scripted model)")
    cols = (
        "store",
        "sessions",
        "turns",
        "prompt msgs",
        "turns/s",
        "p50 ms",
        "p99 ms",
        "CPU ms/turn",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "store" else "right")
    table.add_column("of which loop | store thread", justify="right")
    for r in results:
        table.add_row(
            r.store + (" (ref)" if r.store == "memory" else ""),
            str(r.concurrency),
            str(r.turns),
            f"{r.prompt:.0f}",
            f"{r.turns_per_s:,.0f}",
            f"{r.pct_ms(0.50):.2f}",
            f"{r.pct_ms(0.99):.2f}",
            f"{r.cpu_ms:.2f}",
            f"{r.loop_cpu_ms:.2f} | {max(0.0, r.cpu_ms - r.loop_cpu_ms):.2f}",
        )
    return table


def history_table(results: list[Result]) -> Table:
    table = Table(title="Turn overhead by history length (1 session, one turn at a time)")
    cols = ("store", "window", "history", "prompt msgs", "turns/s", "p50 ms", "p99 ms", "CPU ms")
    for col in cols:
        table.add_column(col, justify="left" if col in ("store", "window") else "right")
    table.add_column("10k/10: p50, CPU", justify="right")
    base: dict[tuple[str, str], Result] = {}
    for r in results:
        ratio = ""
        if r.history is not None and r.history <= 100:
            base[(r.store, r.window)] = r
        elif (b := base.get((r.store, r.window))) is not None:
            p50 = r.pct_ms(0.5) / b.pct_ms(0.5)
            cpu = r.cpu_ms / b.cpu_ms
            ratio = f"{p50:.2f}x, {cpu:.2f}x {verdict(max(p50, cpu) <= RATIO_TARGET)}"
        table.add_row(
            r.store,
            r.window,
            f"{r.history:,}",
            f"{r.prompt:.0f}",
            f"{r.turns_per_s:,.0f}",
            f"{r.pct_ms(0.50):.2f}",
            f"{r.pct_ms(0.99):.2f}",
            f"{r.cpu_ms:.2f}",
            ratio,
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=None, help="turns per session (default 80)")
    parser.add_argument("--quick", action="store_true", help="a short run (10 turns/session)")
    parser.add_argument(
        "--profile", action="store_true", help="also profile SQLite at concurrency 64"
    )
    parser.add_argument("--only-profile", action="store_true", help="skip the tables, just profile")
    args = parser.parse_args()
    turns: int = args.turns or (10 if args.quick else 80)
    history_turns = turns * (2 if args.quick else 3)
    long_history = 10_000

    command = " ".join([".venv/bin/python", "bench/turn_overhead.py", *sys.argv[1:]])
    console.print(f"[bold]Command:[/] {command}")
    console.print(
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"{platform.machine()}, {_cpus()} CPUs; {turns} turns/session, "
        f"{WARMUP_TURNS} warm-up turns not counted; load average {_load()} "
        "(CPU times inflate when other processes share the cores)"
    )
    if args.only_profile:
        profile(turns)
        return

    started = time.perf_counter()
    conc: list[Result] = []
    for kind in STORES:
        for c in (1, 16, 64):
            conc.append(
                asyncio.run(
                    run_config(
                        kind, concurrency=c, turns=turns, context_budget=FIXED_CONTEXT_BUDGET
                    )
                )
            )
    console.print(concurrency_table(conc))
    console.print(
        f"All rows: context_budget={FIXED_CONTEXT_BUDGET} tokens, so the prompt stays the same "
        "size as sessions grow and the rows differ only in concurrency and store."
    )

    hist: list[Result] = []
    for kind in STORES:
        for budget in (None, FIXED_CONTEXT_BUDGET):
            for length in (10, long_history):
                hist.append(
                    asyncio.run(
                        run_config(
                            kind,
                            concurrency=1,
                            turns=history_turns,
                            history=length,
                            context_budget=budget,
                        )
                    )
                )
    console.print(history_table(hist))
    console.print(
        f"window: default = what the model's context window leaves; "
        f"fixed = context_budget={FIXED_CONTEXT_BUDGET} tokens (~20 items). "
        f"The 10-item rows rotate over sessions so none passes {10 + 2 * SMALL_SESSION_TURNS}."
    )

    sqlite64 = next(r for r in conc if r.store == "sqlite" and r.concurrency == 64)
    console.print("\n[bold]Targets[/]")
    console.print(
        f"  CPU per turn, SQLite, 64 sessions: {sqlite64.cpu_ms:.2f} ms "
        f"(target <= {CPU_TARGET_MS:.1f} ms) {verdict(sqlite64.cpu_ms <= CPU_TARGET_MS)}"
    )
    for window, what in (("fixed", "same prompt: cost of length"), ("default", "full window")):
        small = next(
            r for r in hist if r.store == "sqlite" and r.window == window and r.history == 10
        )
        big = next(
            r for r in hist if r.store == "sqlite" and r.window == window and r.history != 10
        )
        ratio = big.cpu_ms / small.cpu_ms
        console.print(
            f"  10,000 / 10 items, SQLite, {window} window ({what}): {ratio:.2f}x CPU, "
            f"{big.pct_ms(0.5) / small.pct_ms(0.5):.2f}x p50 "
            f"(target <= {RATIO_TARGET}x) {verdict(ratio <= RATIO_TARGET)}"
        )
    console.print(f"\nTotal {time.perf_counter() - started:.0f} s")
    if args.profile:
        profile(turns)


def _cpus() -> int:
    return os.cpu_count() or 1


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
