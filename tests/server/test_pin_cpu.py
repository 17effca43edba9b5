"""``tether serve`` on SQLite runs its event loop and its store's thread on one CPU
(:mod:`tether.affinity`), the rest of the process on every CPU it may use;
``TETHER_PIN_CPU=off`` pins nothing. Linux with 2 CPUs or more, else skipped."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from tests.server.conftest import Server, start_server

ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
pytestmark = pytest.mark.skipif(
    len(ALLOWED) < 2,
    reason="needs Linux and 2 CPUs or more (sched_setaffinity); run on such a machine",
)


def threads_cpus(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of ``pid`` and the CPUs it may run on."""
    out: dict[int, frozenset[int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            out[int(tid)] = frozenset(os.sched_getaffinity(int(tid)))
    return out


def pinned_threads(pid: int) -> dict[int, frozenset[int]]:
    return {tid: cpus for tid, cpus in threads_cpus(pid).items() if cpus != ALLOWED}


def turn(srv: Server) -> None:
    with srv.client() as c:
        assert c.post("/v1/sessions", json={"session_id": "pin"}).status_code == 201
        r = c.post("/v1/sessions/pin/turns", json={"input": "hello"})
        assert r.status_code == 200, r.text


def test_serve_pins_the_loop_and_the_store_thread_to_one_cpu(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data")
    try:
        turn(srv)  # threads a turn starts (executors, the model's) are not pinned
        pid = srv.proc.pid
        pinned = pinned_threads(pid)
        assert len(pinned) == 2, threads_cpus(pid)
        assert pid in pinned  # the main thread: the event loop's
        (cpus,) = set(pinned.values())
        assert len(cpus) == 1 and cpus <= ALLOWED
        assert len(threads_cpus(pid)) > 2  # and others, on every CPU
    finally:
        assert srv.stop() == 0


def test_pin_cpu_off_pins_nothing_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data", env={"TETHER_PIN_CPU": "off"})
    try:
        turn(srv)
        assert pinned_threads(srv.proc.pid) == {}
    finally:
        assert srv.stop() == 0
    bad = start_server(tmp_path / "bad", env={"TETHER_PIN_CPU": "maybe"}, wait=False)
    assert bad.proc.wait(timeout=30) == 2
    assert "TETHER_PIN_CPU='maybe': on or off" in bad.output()
