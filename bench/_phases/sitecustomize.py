"""Loaded by ``bench/turn_phases.py`` into the ``tether serve`` it measures (this directory is
put first on that process's ``PYTHONPATH``; nothing else imports it). With
``TETHER_BENCH_PHASES`` set to a file, it times the parts of every turn by wrapping tether's
own functions, and appends what it timed to that file every half second as JSON lines
(``[wall time, part, seconds]``). The names it wraps are internal: when one moves, Python reports
the error of this module at the server's start and runs the server unmeasured, and
``turn_phases.py`` stops at the first round that got no figures."""

from __future__ import annotations

import os

if os.environ.get("TETHER_BENCH_PHASES"):
    import asyncio
    import functools
    import importlib
    import json
    import threading
    import time
    from typing import Any

    OUT = os.environ["TETHER_BENCH_PHASES"]
    _samples: list[tuple[float, str, float]] = []
    _lock = threading.Lock()

    def _note(part: str, seconds: float) -> None:
        with _lock:
            _samples.append((time.time(), part, seconds))

    def _timed(module: str, owner: str | None, name: str, part: str) -> None:
        mod = importlib.import_module(module)
        where: Any = getattr(mod, owner) if owner else mod
        fn = getattr(where, name)

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                _note(part, time.perf_counter() - start)

        setattr(where, name, wrapper)

    # The parts of a turn on POST /v1/sessions/{sid}/turns, outermost first. model_step,
    # prepare and send are wrapped where their callers look them up.
    _timed("tether.server.turn_lane", "TurnLane", "__call__", "request")
    _timed("tether.store.sqlite.turns", "Turns", "enqueue_turn_taken", "store: admit")
    _timed("tether.loop.turn", None, "prepare", "prepare")
    _timed("tether.loop.turn", None, "model_step", "model step")
    _timed("tether.models.openai", None, "send", "model: send to headers")
    _timed("tether.store.sqlite.turns", "Turns", "end_turn_released", "store: end")

    # Between the parts: when a turn's submit returned, its runner started and ended, and its
    # waiter (the request) woke.
    _marks: dict[str, dict[str, float]] = {}
    core = importlib.import_module("tether.scheduler.core")
    runner = importlib.import_module("tether.scheduler.runner")
    _submit, _wait, _run = core.Scheduler.submit, core.Scheduler.wait, runner.TurnRunner.run

    async def submit(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        turn = await _submit(self, *args, **kwargs)
        now = time.perf_counter()
        _note("submit (admission)", now - start)
        marks = _marks.setdefault(turn.id, {})
        marks["submitted"] = now
        if "ran" in marks:
            _note("runner's start to submit's return", now - marks["ran"])
        return turn

    async def run(self: Any, lease: Any, turn: Any, *args: Any, **kwargs: Any) -> Any:
        marks = _marks.setdefault(turn.id, {})
        marks["ran"] = now = time.perf_counter()
        if "submitted" in marks:
            _note("submit's return to the runner's start", now - marks["submitted"])
        try:
            return await _run(self, lease, turn, *args, **kwargs)
        finally:
            marks["run"] = time.perf_counter()
            _note("runner", marks["run"] - now)

    async def wait(self: Any, key: Any, turn_id: str, **kwargs: Any) -> Any:
        try:
            return await _wait(self, key, turn_id, **kwargs)
        finally:
            marks = _marks.pop(turn_id, {})
            if "run" in marks:
                _note("runner's end to the waiter", time.perf_counter() - marks["run"])

    core.Scheduler.submit, core.Scheduler.wait, runner.TurnRunner.run = submit, wait, run

    # The SQLite store's thread: how long a call waits for its batch, and a batch's wall time
    # against its thread's CPU time.
    worker = importlib.import_module("tether.store.sqlite.worker")
    _Op = getattr(worker, "_Op")  # noqa: B009 (a private name, read as one)
    _queued: dict[int, float] = {}

    class _TimedOp(_Op):  # type: ignore[misc,valid-type]
        __slots__ = ("delivered",)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _queued[id(self)] = time.perf_counter()
            self.delivered = 0.0

    setattr(worker, "_Op", _TimedOp)  # noqa: B010
    _execute = worker.SQLiteWorker._execute

    def execute(self: Any, batch: list[Any]) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        for op in batch:
            queued = _queued.pop(id(op), None)
            if queued is not None:
                _note("store thread: wait for a batch", start - queued)
        try:
            _execute(self, batch)
        finally:
            wall = time.perf_counter() - start
            _note("store thread: batch, wall", wall)
            _note("store thread: batch, CPU", time.thread_time() - cpu)
            _note("store thread: calls a batch", float(len(batch)))
            now = time.perf_counter()
            for op in batch:
                op.delivered = now

    worker.SQLiteWorker._execute = execute
    _resolve = getattr(worker, "_resolve")  # noqa: B009

    def resolve(ops: list[Any]) -> None:
        now = time.perf_counter()
        for op in ops:
            if op.delivered:
                _note("store thread: answer to the loop", now - op.delivered)
        _resolve(ops)

    setattr(worker, "_resolve", resolve)  # noqa: B010

    # How late a 5 ms sleep wakes on the event loop: what any await waits behind others.
    _start = worker.SQLiteWorker.start

    async def start(self: Any) -> None:
        await _start(self)

        async def probe() -> None:
            while True:
                begun = time.perf_counter()
                await asyncio.sleep(0.005)
                _note("event loop: a 5 ms sleep's lateness", time.perf_counter() - begun - 0.005)

        self._bench_probe = asyncio.get_running_loop().create_task(probe())

    worker.SQLiteWorker.start = start

    def _dump() -> None:
        while True:
            time.sleep(0.5)
            with _lock:
                out = _samples[:]
                _samples.clear()
            if out:
                with open(OUT, "a") as f:
                    f.write(json.dumps(out) + "\n")

    threading.Thread(target=_dump, name="bench-phases", daemon=True).start()
