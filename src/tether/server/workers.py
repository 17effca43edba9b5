"""``tether serve --workers N``: N server processes behind one listening socket and one store.

A Python process runs its event loop on one core. Workers multiply that: the parent binds the
socket once (a taken port stays a plain error), applies the store's migrations once, then forks
N workers. Each builds its own app (store connection, scheduler, event loop) and serves with
uvicorn the connections the parent accepts and hands to the workers in turn, each over a Unix
socket of its own (:mod:`tether.server.handed`: how, and why — workers accepting on a shared
socket split a burst of connections 57/7). The workers coordinate through the store alone,
exactly as separate servers on one database do (DESIGN §4): each is a node of its own,
``<node>-w1``, ``<node>-w2``…

Forking, rather than starting fresh interpreters, keeps agents defined in a script's
``__main__`` (``App(...).serve(workers=4)``) servable, and costs no import per worker. It is
safe because at fork time the parent holds no store connection, no event loop and no thread:
it has only imported modules, loaded the agents, bound the socket and migrated the store (on a
loop and a connection it closed again).

The parent supervises. SIGTERM or SIGINT is passed on to every worker as SIGTERM (each drains
as a single server does) and the parent exits once all have. A worker that dies otherwise is
logged and started again under the same node name; the turn it was running is ended
``failed``/``owner_lost`` by the crash recovery of whichever worker takes its session next (the
owner id of a lease names the process: ``node|host|pid|nonce``, so a dead worker's lease is
told from its successor's, and the successor looks at every session with work as it starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import logging
import math
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from tether.errors import ConfigError, StoreError
from tether.server.handed import Dispatch
from tether.server.settings import Settings
from tether.store import open_store_url

log = logging.getLogger("tether.serve")

RunWorker = Callable[[Settings, Callable[[], None], socket.socket], None]
"""Serve in this process with ``settings`` (the worker's own node name) the connections that
arrive on the channel (:class:`~tether.server.handed.Handed`), calling ``ready()`` once the app
has started and the channel is served; raise ``SystemExit(3)`` if it cannot start."""

STARTUP_FAILURE = 3
"""The exit code when the workers cannot start (uvicorn's, as a single server exits)."""
CONFIG_ERROR = 2
"""A worker's exit code for a :class:`ConfigError` (the CLI's, for one process)."""
QUICK_DEATH = 10.0
"""A worker that dies this soon after it started, twice or more in a row, is started again
after a pause that doubles (up to ``RESTART_PAUSE_MAX``): one that cannot run does not spin."""
RESTART_PAUSE_MAX = 10.0
STOP_GRACE = 15.0
"""Seconds beyond a worker's own shutdown bound (drain, then open connections) before the
parent kills a worker that still has not exited."""

_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_node(node: str | None, index: int) -> str:
    """The node name of worker ``index`` (from 1): distinct per worker, the same after a
    restart, so the log and the lease owners say which slot a process fills."""
    return f"{node or 'node'}-w{index}"


def check_workers(settings: Settings) -> None:
    """Refuse what cannot run as several processes, before anything is bound or opened."""
    if not hasattr(os, "fork"):
        raise ConfigError(
            "--workers needs a platform with fork() (Linux, macOS); run several `tether serve` "
            "processes on one PostgreSQL database instead"
        )
    if settings.store_url == "memory://":
        raise ConfigError(
            "--workers with a memory:// store: each worker would have a store of its own; use a "
            "SQLite file or PostgreSQL"
        )
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("--workers: serve from the main thread (workers are signalled there)")


def prepare_store(url: str) -> None:
    """Apply the store's migrations here, once, before any worker opens the store.

    The stores take turns on their own (SQLite's ``BEGIN IMMEDIATE``, PostgreSQL's advisory
    lock), but workers opening a fresh file together would also race to create it and switch
    it to WAL; one process doing it first leaves them nothing to race on. A store that cannot
    be opened is a failure to start, as for a single server."""

    async def migrate() -> None:
        store = open_store_url(url)
        await store.open()
        await store.close()

    try:
        asyncio.run(migrate())
    except StoreError as exc:
        log.error("cannot open the store: %s", exc)
        raise SystemExit(STARTUP_FAILURE) from None


@dataclass
class _Slot:
    index: int
    node: str
    pid: int = 0
    """The live worker's pid; 0 while the slot has none."""
    started_at: float = 0.0
    ready: bool = False
    was_ready: bool = False
    quick_deaths: int = 0
    restart_at: float | None = None


def _ignore(signum: int, frame: FrameType | None) -> None:
    """A Python-level handler, so that the signal reaches the wakeup pipe (the loop reads it)."""


class Supervisor:
    """Starts the workers, restarts those that die, stops them all on SIGTERM/SIGINT."""

    def __init__(
        self,
        settings: Settings,
        sock: socket.socket,
        run_worker: RunWorker,
        *,
        on_ready: Callable[[], object] | None = None,
        stop_within: float = 30.0,
    ) -> None:
        self.settings = settings
        self.sock = sock
        self.run_worker = run_worker
        self.on_ready = on_ready
        self.stop_within = stop_within
        self.slots = [
            _Slot(index, worker_node(settings.node, index))
            for index in range(1, settings.workers + 1)
        ]
        self.code = 0
        self.stopping = False
        self.announced = False
        self._stop_deadline = math.inf
        self._parent = os.getpid()
        self._pending = b""
        self._ready_r = self._ready_w = self._wake_r = self._wake_w = -1
        self.dispatch = Dispatch(sock)

    def run(self) -> int:
        """Supervise until every worker has exited; the exit code the parent should give."""
        others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        if others:
            # Not an error: a thread of the caller's own is simply absent from the workers; but
            # a lock it holds at fork time stays held there for good.
            log.warning("forking workers while other threads run: %s", ", ".join(others))
        self._ready_r, self._ready_w = os.pipe()
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._ready_r, self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        previous = {sig: signal.signal(sig, _ignore) for sig in _HANDLED}
        previous_wakeup = signal.set_wakeup_fd(self._wake_w)
        try:
            for slot in self.slots:
                if not self.stopping:
                    self._start(slot)
            self._loop()
        finally:
            self._kill_all()  # only if something above raised: none is left otherwise
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for fd in (self._ready_r, self._ready_w, self._wake_r, self._wake_w):
                os.close(fd)
            self.dispatch.close()
        return self.code

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self) -> None:
        look_at = 0.0  # when the children are looked at next, SIGCHLD or not
        while not (self.stopping and not self._live()):
            # The connections: accepted while a worker has room for them, and what the workers
            # say they took (:class:`~tether.server.handed.Dispatch`).
            watched = [self._ready_r, self._wake_r, *self.dispatch.watched(time.monotonic())]
            readable: list[int] = []
            with contextlib.suppress(InterruptedError):
                readable, _, _ = select.select(watched, [], [], self._timeout())
            # Only what woke the loop is read: a connection a second costs its accept and its
            # hand-over here, not a look at every pipe and child.
            if self._wake_r in readable:
                self._read_signals()  # SIGCHLD among them: a child to reap
            if self._ready_r in readable:
                self._read_ready()
            if self._wake_r in readable or time.monotonic() >= look_at:
                self._reap()
                look_at = time.monotonic() + 1.0
            self.dispatch.handle(readable, time.monotonic())
            now = time.monotonic()
            if self.stopping and now >= self._stop_deadline:
                self._stop_deadline = math.inf
                for slot in self._live():
                    log.error("worker %s (pid %d) did not stop in time; killed", *_who(slot))
                    self._signal(slot, signal.SIGKILL)
                self.code = self.code or 1
            for slot in self.slots:
                if not self.stopping and slot.restart_at is not None and now >= slot.restart_at:
                    self._start(slot)

    def _timeout(self) -> float:
        # The wakeup pipe and the ready pipe wake the loop; this bound is for restarts that are
        # due, the stop deadline, and a safety look at the children now and then.
        due = [s.restart_at for s in self.slots if s.restart_at is not None]
        dispatch = self.dispatch.wake_at(time.monotonic())
        if dispatch is not None:
            due.append(dispatch)
        wake = min([*due, self._stop_deadline, time.monotonic() + 1.0])
        return max(0.0, wake - time.monotonic())

    def _live(self) -> list[_Slot]:
        return [s for s in self.slots if s.pid]

    def _read_signals(self) -> None:
        with contextlib.suppress(BlockingIOError):
            for signum in os.read(self._wake_r, 512):
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self._stop(signum)

    def _read_ready(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._pending += os.read(self._ready_r, 4096)
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            slot = self._slot_of(int(line)) if line.isdigit() else None
            if slot is None or self.stopping:
                continue
            slot.ready = slot.was_ready = True
            self.dispatch.ready(slot.index)
            log.info("worker %s ready (pid %d)", *_who(slot))
        if not self.announced and not self.stopping and all(s.ready for s in self.slots):
            self.announced = True
            if self.on_ready is not None:
                self.on_ready()

    def _reap(self) -> None:
        # Each child by its pid: waitpid(-1) would also reap children that are not ours.
        for slot in self._live():
            try:
                pid, status = os.waitpid(slot.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = slot.pid, 0
            if pid:
                self._exited(slot, status)

    def _slot_of(self, pid: int) -> _Slot | None:
        return next((s for s in self.slots if s.pid == pid), None)

    # -- events ----------------------------------------------------------------------------------
    def _exited(self, slot: _Slot, status: int) -> None:
        node, pid = _who(slot)
        code = os.waitstatus_to_exitcode(status)
        uptime = time.monotonic() - slot.started_at
        slot.pid, slot.ready = 0, False
        self.dispatch.gone(slot.index)
        if self.stopping:
            # SIGTERM before the worker had its handlers in place is a stop like any other.
            if code not in (0, -signal.SIGTERM):
                log.warning("worker %s (pid %d) ended with %s", node, pid, _how(code))
                if self.code == 0:
                    self.code = 1
            return
        if not self.announced and not slot.was_ready:
            log.error("worker %s (pid %d) failed to start (%s)", node, pid, _how(code))
            # A configuration error exits 2, as it does with one process; anything else 3.
            self.code = CONFIG_ERROR if code == CONFIG_ERROR else STARTUP_FAILURE
            self._stop(signal.SIGTERM)
            return
        slot.quick_deaths = slot.quick_deaths + 1 if uptime < QUICK_DEATH else 0
        pause = 0.0
        if slot.quick_deaths > 1:
            pause = min(0.5 * 2 ** (slot.quick_deaths - 2), RESTART_PAUSE_MAX)
        log.error(
            "worker %s (pid %d) died (%s); starting it again%s",
            node,
            pid,
            _how(code),
            f" in {pause:g} s" if pause else "",
        )
        slot.restart_at = time.monotonic() + pause

    def _stop(self, signum: int) -> None:
        if self.stopping:
            if signum == signal.SIGINT:
                # A second Ctrl-C: as with a single server, stop without waiting for the drain.
                for slot in self._live():
                    self._signal(slot, signal.SIGINT)
            return
        self.stopping = True
        self._stop_deadline = time.monotonic() + self.stop_within
        for slot in self.slots:
            slot.restart_at = None
        # SIGTERM, whatever came: a Ctrl-C has sent each worker a SIGINT of its own already
        # (one process group), and a second SIGINT would make uvicorn skip the drain.
        for slot in self._live():
            self._signal(slot, signal.SIGTERM)
        # No worker is started from here on: let the port refuse connections rather than queue
        # them for nobody (the workers hold no copy of it).
        self.dispatch.stop()

    def _signal(self, slot: _Slot, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(slot.pid, signum)

    def _kill_all(self) -> None:
        for slot in self._live():
            self._signal(slot, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(slot.pid, 0)
            slot.pid = 0

    # -- starting a worker -----------------------------------------------------------------------
    def _start(self, slot: _Slot) -> None:
        slot.restart_at, slot.ready = None, False
        # What the parent buffered would be written again by each child as it exits.
        sys.stdout.flush()
        sys.stderr.flush()
        # Signals wait until the child has its own handlers: one delivered in between would run
        # the parent's and write to the parent's wakeup pipe, as if the parent had received it.
        try:
            theirs = self.dispatch.open(slot.index)
        except OSError as exc:
            log.error("cannot start worker %s: %s", slot.node, exc)
            self._not_started(slot)
            return
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)
        try:
            pid = os.fork()
        except OSError as exc:
            self.dispatch.gone(slot.index)
            theirs.close()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            log.error("cannot start worker %s: %s", slot.node, exc)
            self._not_started(slot)
            return
        if pid == 0:
            self._child(slot, mask, theirs)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
        slot.pid, slot.started_at = pid, time.monotonic()
        log.info("worker %s started (pid %d)", slot.node, pid)

    def _not_started(self, slot: _Slot) -> None:
        if not self.announced:
            self.code = STARTUP_FAILURE
            self._stop(signal.SIGTERM)
        else:
            slot.restart_at = time.monotonic() + RESTART_PAUSE_MAX

    def _child(
        self, slot: _Slot, mask: set[int | signal.Signals], channel: socket.socket
    ) -> NoReturn:
        """The worker's whole life: it never returns into the parent's stack (``os._exit``)."""
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for fd in (self._ready_r, self._wake_r, self._wake_w):
                os.close(fd)
            # The parent accepts, and the other workers' channels and the connections the parent
            # holds are not this worker's: closed here, a connection another worker closes
            # is closed, and the port refuses connections once the parent has closed it.
            self.dispatch.forget()
            _die_with(self._parent)
            ready_w = self._ready_w

            def ready() -> None:
                os.write(ready_w, f"{os.getpid()}\n".encode())

            worker_settings = dataclasses.replace(
                self.settings, node=slot.node, workers=1, worker=slot.index
            )
            self.run_worker(worker_settings, ready, channel)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except KeyboardInterrupt:
            code = 0  # Ctrl-C before uvicorn had its handlers: nothing was started to drain
        except ConfigError as exc:
            log.error("worker %s: %s", slot.node, exc)
            code = CONFIG_ERROR
        except BaseException:
            traceback.print_exc()
        finally:
            with contextlib.suppress(BaseException):
                logging.shutdown()
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _die_with(parent: int) -> None:
    """Have the kernel send this worker SIGTERM when the parent dies (``kill -9``): it drains
    and exits rather than serve on unsupervised (Linux; elsewhere it serves until stopped)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        raise SystemExit(0)  # the parent died before the line above: nobody to serve for


def _who(slot: _Slot) -> tuple[str, int]:
    return slot.node, slot.pid


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
