"""``tether serve`` on SQLite runs its event loop and its store's thread on one CPU
(:mod:`tether.affinity`), the rest of the process on every CPU it may use — the threads a turn
starts too: the model client's (uvloop's resolver pool, started by native code), the
embedder's; ``TETHER_PIN_CPU=off`` pins nothing. Linux with 2 CPUs or more, else skipped."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.server.conftest import Server, start_server
from tether.testing.fake_openai import FakeOpenAIServer

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


def comm(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def pinned_threads(pid: int) -> dict[int, frozenset[int]]:
    return {tid: cpus for tid, cpus in threads_cpus(pid).items() if cpus != ALLOWED}


def turn(srv: Server) -> None:
    """A turn of an agent whose model is over HTTP, and a fact remembered (embedded)."""
    with srv.client() as c:
        body = {"session_id": "pin", "agent": "upstream"}
        assert c.post("/v1/sessions", json=body).status_code == 201
        r = c.post("/v1/sessions/pin/turns", json={"input": "hello"})
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
        assert c.post("/v1/memory", json={"content": "The user likes tea."}).status_code == 201


def wait_pinned(pid: int, count: int, within: float = 20) -> dict[int, frozenset[int]]:
    """The pinned threads once there are ``count``, or after ``within`` seconds (pinning
    waits for the embedder's warm-up)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pinned = pinned_threads(pid)
        if len(pinned) >= count:
            return pinned
        time.sleep(0.05)
    return pinned_threads(pid)


def test_serve_pins_the_loop_and_the_store_thread_to_one_cpu(
    tmp_path: Path, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script("fine")
    env = {"FAKE_OPENAI_URL": fake_openai.base_url, "TETHER_PIN_CPU": "on"}
    srv = start_server(tmp_path / "data", env=env)
    try:
        pid = srv.proc.pid
        wait_pinned(pid, 2)
        turn(srv)
        # uvloop's resolver threads, which native code starts from the event loop's thread
        # (the model client's lookup would have started them pinned), are there, unpinned.
        resolvers = [t for t in threads_cpus(pid) if comm(pid, t) == "libuv-worker"]
        assert resolvers and all(t not in pinned_threads(pid) for t in resolvers)
        pinned = pinned_threads(pid)
        assert len(pinned) == 2, threads_cpus(pid)
        assert pid in pinned  # the main thread: the event loop's
        (cpus,) = set(pinned.values())
        assert len(cpus) == 1 and cpus <= ALLOWED
    finally:
        assert srv.stop() == 0


def test_pin_cpu_off_pins_nothing_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data", env={"TETHER_PIN_CPU": "off"})
    try:
        with srv.client() as c:
            assert c.post("/v1/sessions", json={"session_id": "off"}).status_code == 201
            assert c.post("/v1/sessions/off/turns", json={"input": "hi"}).status_code == 200
        # A server pins a moment after it serves (once its embedder has warmed up): longer
        # than it takes with pinning on (wait_pinned above), nothing is pinned here.
        assert wait_pinned(srv.proc.pid, 1, within=5) == {}
    finally:
        assert srv.stop() == 0
    bad = start_server(tmp_path / "bad", env={"TETHER_PIN_CPU": "maybe"}, wait=False)
    assert bad.proc.wait(timeout=30) == 2
    assert "TETHER_PIN_CPU='maybe': on or off" in bad.output()
