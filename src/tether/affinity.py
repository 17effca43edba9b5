"""One CPU for the event loop's thread and the SQLite store's thread (Linux; ``tether serve``).

The two threads share the interpreter's lock, and the store's thread hands it back at every
SQLite statement it runs. On two CPUs each hand-over wakes the other CPU, which takes the
lock and moves the caches the two threads share; under load the store's thread then gets the
lock back once a turn of the event loop, a statement at a time (its batches spent ~30 % of
their wall time on a CPU), and both threads pay for the moves. On one CPU a statement's
hand-back has nobody to run until the thread yields the CPU: a batch runs through, and the
loop resumes where it was. Measured on a 2-core host (``bench/turn_phases.py``, alternated
A/B runs): at 64 sessions, 11-23 % more turns a second and 13-16 % less CPU a turn; one
session at a time, 8 % less CPU.

The rest of the process keeps every CPU it had. A thread inherits the CPUs of the thread that
starts it, so every thread started after :func:`pin` gives the pinned CPU up before it runs
(a ``threading.setprofile`` hook, chained to one already set: the embedded model's and the
embedders' threads, the executors' and the tools'); a process inherits them too, so a process
started from the pinned thread is started inside :func:`spread`, which gives the thread its
CPUs back for that long (the sandbox, MCP servers over stdio; an async tool that starts one
should too). Threads that native code starts from the pinned thread pass no hook: the server
pins once the embedder has warmed up and uvloop's resolver pool exists, and sweeps such
threads back to every CPU now and then (:meth:`Pinned.sweep`). Turned off with
``TETHER_PIN_CPU=off``; a machine (or a mask) of one CPU has nothing to pin.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = ["Pinned", "choose", "pin", "spread"]

log = logging.getLogger("tether.server")

_Profile = Any  # what threading.setprofile takes: a sys.setprofile function, or None


@dataclass
class Pinned:
    """Threads of this process made to share one CPU, and what they had before."""

    cpu: int
    threads: tuple[int, ...]
    """Native thread ids; the first is the event loop's (the one that pinned)."""
    original: frozenset[int]
    previous_hook: _Profile = None
    hook: _Profile = None
    spreading: int = field(default=0)
    """Spawns under way inside :func:`spread` (the loop's thread is pinned again after the
    last)."""

    def undo(self) -> None:
        """Give the threads their CPUs back (a thread that has ended is skipped), and every
        other thread still on this one CPU (:meth:`sweep`)."""
        global _pinned
        self.sweep()
        if _pinned is self:
            _pinned = None
            if threading.getprofile() is self.hook:  # else another has been set since: kept
                threading.setprofile(self.previous_hook)
        alive = _threads()
        for tid in self.threads:
            # One that has ended (the store's, closed before this) is skipped: its id may be
            # another thread's by now.
            if tid in alive:
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(tid, self.original)

    def sweep(self) -> int:
        """Give the CPUs back to every other thread of the process pinned to this one CPU
        (what native code started from the pinned thread, past the hook: uvloop's resolver
        pool, a tokenizer's pool); how many there were."""
        released = 0
        for tid in _threads() - set(self.threads):
            with contextlib.suppress(OSError):  # ended meanwhile
                if os.sched_getaffinity(tid) == {self.cpu}:
                    os.sched_setaffinity(tid, self.original)
                    released += 1
        return released


_pinned: Pinned | None = None


def choose(worker: int = 0) -> int | None:
    """The CPU to pin to: the ``worker``-th of the CPUs this process may use, round the list
    (workers from 1, each on its own while there are enough), or, with no worker, the one this
    thread runs on now; None where there is nothing to gain (one CPU) or no way to pin."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None
    if worker > 0:
        return allowed[(worker - 1) % len(allowed)]
    now = _cpu_now()
    return now if now in allowed else allowed[0]


def pin(others: Sequence[int], cpu: int) -> Pinned | None:
    """Pin the calling thread and the threads ``others`` (native ids) to ``cpu``, and have
    every thread started afterwards give that CPU up; None (nothing changed) when one is
    pinned already or the kernel refuses."""
    global _pinned
    if _pinned is not None:
        return None
    original = frozenset(os.sched_getaffinity(0))
    threads = (threading.get_native_id(), *others)
    done: list[int] = []
    try:
        for tid in threads:
            os.sched_setaffinity(tid, {cpu})
            done.append(tid)
    except OSError as exc:
        for tid in done:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, original)
        log.warning("cannot pin the event loop and the store's thread to CPU %d: %s", cpu, exc)
        return None
    pinned = Pinned(cpu, threads, original, threading.getprofile())
    pinned.hook = _release_hook(pinned)
    threading.setprofile(pinned.hook)
    _pinned = pinned
    return pinned


@contextlib.contextmanager
def spread() -> Iterator[None]:
    """Around the start of a process from the pinned thread: the thread has its CPUs back
    for that long, so the process inherits them (not the one CPU). Elsewhere, a no-op."""
    pinned = _pinned
    if pinned is None or threading.get_native_id() != pinned.threads[0]:
        yield
        return
    if pinned.spreading == 0:
        with contextlib.suppress(OSError):  # refused (a cpuset changed): it starts as it can
            os.sched_setaffinity(0, pinned.original)
    pinned.spreading += 1
    try:
        yield
    finally:
        pinned.spreading -= 1
        if pinned.spreading == 0 and _pinned is pinned:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {pinned.cpu})


def _release_hook(pinned: Pinned) -> _Profile:
    """What each new thread runs first (as its profile function, once): give the pinned CPU
    up if it inherited it (a thread that chose its CPUs itself keeps them), then hand the thread
    to the profile hook set before (if any), as if ours were not."""
    previous = pinned.previous_hook

    def release(frame: FrameType, event: str, arg: object) -> None:
        sys.setprofile(previous)
        with contextlib.suppress(OSError):
            if os.sched_getaffinity(0) == {pinned.cpu}:
                os.sched_setaffinity(0, pinned.original)
        if previous is not None:
            previous(frame, event, arg)

    return release


def _threads() -> set[int]:
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _cpu_now() -> int | None:
    """The CPU this thread runs on (``/proc/thread-self/stat``'s 39th field)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None
