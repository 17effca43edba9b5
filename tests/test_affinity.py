"""tether.affinity: the event loop's thread and the store's thread on one CPU, and nothing else.

Linux with two CPUs or more (a mask of one leaves nothing to pin): skipped elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import FrameType

import pytest

from tether import affinity
from tether.tools.sandbox import process

ALLOWED = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()
pytestmark = pytest.mark.skipif(
    len(ALLOWED) < 2,
    reason="needs Linux and 2 CPUs or more (sched_setaffinity); run on such a machine",
)


@pytest.fixture
def store_thread() -> Iterator[int]:
    """A thread that waits, standing for the store's: its native id."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait, daemon=True)
    thread.start()
    assert thread.native_id is not None
    yield thread.native_id
    done.set()
    thread.join()


@pytest.fixture
def pinned(store_thread: int) -> Iterator[affinity.Pinned]:
    cpu = affinity.choose()
    assert cpu is not None and cpu in ALLOWED
    done = affinity.pin([store_thread], cpu)
    assert done is not None
    yield done
    done.undo()


def cpus_of(tid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(tid))


def listed(status: bytes) -> frozenset[int]:
    """The CPUs of a ``Cpus_allowed_list`` line (``0-3,6``)."""
    out: set[int] = set()
    for part in status.decode().split(":", 1)[1].strip().split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return frozenset(out)


def test_the_loop_thread_and_the_store_thread_share_one_cpu_until_undone(
    store_thread: int,
) -> None:
    cpu = affinity.choose()
    assert cpu is not None
    pinned = affinity.pin([store_thread], cpu)
    assert pinned is not None
    try:
        assert cpus_of(0) == {cpu}
        assert cpus_of(store_thread) == {cpu}
        assert affinity.pin([store_thread], cpu) is None  # one pairing a process
    finally:
        pinned.undo()
    assert cpus_of(0) == ALLOWED
    assert cpus_of(store_thread) == ALLOWED


def test_a_thread_started_afterwards_has_every_cpu(pinned: affinity.Pinned) -> None:
    seen: list[frozenset[int]] = []
    thread = threading.Thread(target=lambda: seen.append(cpus_of(0)))
    thread.start()
    thread.join()
    assert cpus_of(0) == {pinned.cpu}  # the starter is still pinned
    assert seen == [ALLOWED]  # it inherited one CPU and gave it up before its work


def test_the_sweep_releases_threads_pinned_past_the_hook(pinned: affinity.Pinned) -> None:
    """Native code's threads pass no hook: one left on the pinned CPU is given every CPU back;
    one that chose other CPUs itself is left alone, and so are the two pinned threads."""
    ready, done = threading.Barrier(3), threading.Event()
    ids: dict[str, int] = {}

    def stay(name: str, cpus: set[int]) -> None:
        os.sched_setaffinity(0, cpus)  # after the hook: as a native thread would be
        ids[name] = threading.get_native_id()
        ready.wait()
        done.wait()

    other = min(ALLOWED - {pinned.cpu})
    threads = [
        threading.Thread(target=stay, args=("inherited", {pinned.cpu})),
        threading.Thread(target=stay, args=("chosen", {other})),
    ]
    for t in threads:
        t.start()
    ready.wait()
    try:
        assert pinned.sweep() == 1
        assert cpus_of(ids["inherited"]) == ALLOWED
        assert cpus_of(ids["chosen"]) == {other}
        assert all(cpus_of(tid) == {pinned.cpu} for tid in pinned.threads)
    finally:
        done.set()
        for t in threads:
            t.join()


def test_undo_releases_a_thread_left_on_the_cpu(store_thread: int) -> None:
    cpu = affinity.choose()
    assert cpu is not None
    pinned = affinity.pin([store_thread], cpu)
    assert pinned is not None
    ready, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def native_like() -> None:
        os.sched_setaffinity(0, {cpu})
        tids.append(threading.get_native_id())
        ready.set()
        done.wait()

    thread = threading.Thread(target=native_like)
    thread.start()
    ready.wait()
    try:
        pinned.undo()
        assert cpus_of(tids[0]) == ALLOWED
    finally:
        done.set()
        thread.join()


def test_a_thread_that_chooses_its_cpus_keeps_them(pinned: affinity.Pinned) -> None:
    other = min(ALLOWED - {pinned.cpu})
    os.sched_setaffinity(0, {other})  # the starter's choice, which the new thread inherits
    try:
        seen: list[frozenset[int]] = []
        thread = threading.Thread(target=lambda: seen.append(cpus_of(0)))
        thread.start()
        thread.join()
        assert seen == [{other}]
    finally:
        os.sched_setaffinity(0, {pinned.cpu})


def test_a_profile_hook_set_before_still_runs_in_new_threads(store_thread: int) -> None:
    calls: list[str] = []

    def hook(frame: FrameType, event: str, arg: object) -> None:
        calls.append(event)
        sys.setprofile(None)  # one event is enough to tell

    threading.setprofile(hook)
    try:
        cpu = affinity.choose()
        assert cpu is not None
        pinned = affinity.pin([store_thread], cpu)
        assert pinned is not None
        try:
            seen: list[frozenset[int]] = []
            thread = threading.Thread(target=lambda: seen.append(cpus_of(0)))
            thread.start()
            thread.join()
        finally:
            pinned.undo()
        assert seen == [ALLOWED]
        assert calls, "the hook set before was not called in the new thread"
        assert threading.getprofile() is hook  # given back as it was
    finally:
        threading.setprofile(None)


async def test_a_sandboxed_process_started_from_the_pinned_loop_has_every_cpu(
    pinned: affinity.Pinned,
) -> None:
    argv = ["grep", "Cpus_allowed_list", "/proc/self/status"]
    # Started as any process is, it would have the one CPU: the sandbox's start spreads.
    plain = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE)
    out, _ = await plain.communicate()
    assert listed(out) == {pinned.cpu}
    started = await process._start(argv, stdin=subprocess.DEVNULL, cwd=None, env=None)
    out, _ = await started.communicate()
    assert listed(out) == ALLOWED
    assert cpus_of(0) == {pinned.cpu}  # pinned again once started


def test_spread_on_another_thread_changes_nothing(pinned: affinity.Pinned) -> None:
    seen: list[frozenset[int]] = []

    def other() -> None:
        os.sched_setaffinity(0, {pinned.cpu})  # as if it had kept the CPU it inherited
        with affinity.spread():
            seen.append(cpus_of(0))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert seen == [{pinned.cpu}]
    assert cpus_of(0) == {pinned.cpu}


def test_nested_spreads_pin_again_after_the_last() -> None:
    cpu = affinity.choose()
    assert cpu is not None
    pinned = affinity.pin([], cpu)
    assert pinned is not None
    try:
        with affinity.spread():
            with affinity.spread():
                assert cpus_of(0) == ALLOWED
            assert cpus_of(0) == ALLOWED  # the outer start is not over
        assert cpus_of(0) == {cpu}
    finally:
        pinned.undo()


def test_workers_get_cpus_of_their_own_and_one_cpu_gets_none() -> None:
    first, second = affinity.choose(1), affinity.choose(2)
    assert first is not None and second is not None and first != second
    assert affinity.choose(len(ALLOWED) + 1) == first  # round the list
    got: list[int | None] = []

    def on_one() -> None:
        os.sched_setaffinity(0, {min(ALLOWED)})
        got.append(affinity.choose())

    thread = threading.Thread(target=on_one)
    thread.start()
    thread.join()
    assert got == [None]
