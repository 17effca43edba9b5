"""Run one process tree to its end, its wall limit or a cancel, and never leave it behind.

The process starts in a session of its own, so its process group holds it and everything it
forks that does not leave the group; a timeout or a cancel sends SIGKILL to the whole group.
Under bubblewrap that group holds bwrap and the pid 1 of its pid namespace (bwrap runs without
``--new-session`` for this); when that pid 1 dies the kernel kills everything else in the
namespace, so no descendant survives, even one that called ``setsid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tether.affinity import spread
from tether.tools.sandbox.base import Limits, Outcome

_DRAIN_SECONDS = 1.0
"""After the process exits, how long its pipes may stay open (held by a straggler) before we
stop reading."""
_CHUNK = 64 * 1024
log = logging.getLogger("tether.sandbox")


@dataclass(slots=True)
class _Capture:
    """What one stream produced: the first ``cap`` bytes, and how many there were in all."""

    cap: int
    data: bytearray
    total: int = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        # Reads to the end even past the cap: a writer blocked on a full pipe would otherwise
        # hang until the wall limit.
        while chunk := await stream.read(_CHUNK):
            self.total += len(chunk)
            room = self.cap - len(self.data)
            if room > 0:
                self.data += chunk[:room]


KILL_WITHIN = 0.2
"""How long :func:`kill_group` keeps at a process group whose members will not go."""


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of the process group ``pgid``, from ``/proc``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # After the command name (which may hold spaces and parentheses): state, ppid, pgrp.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if fields[0] != b"Z" and int(fields[2]) == pgid:
            found.append(int(entry.name))
    return found


def kill_group(pgid: int) -> bool:
    """SIGKILL the process group ``pgid`` until no live member is left (True), for up to
    :data:`KILL_WITHIN` seconds.

    Once is not always enough: a member forked while the group's SIGKILL was delivered (bwrap
    making its sandbox's pid 1, a shell starting a job) can miss it, and under bubblewrap that
    pid 1 is what takes the whole sandbox with it; the kill tests caught such a survivor now and
    then under load. Synchronous on purpose: a caller cancelled again, or a loop shutting down,
    must not leave the killing half done. It blocks only while members remain, which is the
    race's few milliseconds.
    """
    deadline = time.monotonic() + KILL_WITHIN
    while True:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            return True  # no process left in the group
        except PermissionError:
            return False
        if not group_members(pgid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


async def kill_tree(proc: asyncio.subprocess.Process) -> None:
    """Kill the process group ``proc`` leads (:func:`kill_group`), then reap ``proc``."""
    if not kill_group(proc.pid):
        log.warning("process group %d still has live members after SIGKILL", proc.pid)
    await proc.wait()


async def _start(
    argv: list[str], *, stdin: int, cwd: Path | None, env: dict[str, str] | None
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a session of its own; cancelled meanwhile, kill what was started.
    From the event loop's thread, which a server pins to one CPU (:mod:`tether.affinity`),
    the process gets the CPUs the server has (it is forked before ``_started`` returns)."""
    with spread():
        return await _started(argv, stdin=stdin, cwd=cwd, env=env)


async def _started(
    argv: list[str], *, stdin: int, cwd: Path | None, env: dict[str, str] | None
) -> asyncio.subprocess.Process:
    """The process exists before ``create_subprocess_exec`` returns (its pipes are still being
    connected). Cancelled in that moment, asyncio kills the process it started but not its
    process group: bwrap would die, and the sandbox's pid 1, already forked, live on. So the
    start is finished under a shield, and then the whole group is killed.
    """
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    )
    try:
        return await asyncio.shield(starting)
    except asyncio.CancelledError:
        await asyncio.wait({starting})
        if not starting.cancelled() and starting.exception() is None:
            proc = starting.result()
            if not kill_group(proc.pid):
                log.warning("process group %d still has live members after SIGKILL", proc.pid)
            await asyncio.shield(proc.wait())
        raise


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()


async def run_process(
    argv: list[str],
    *,
    limits: Limits,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> Outcome:
    """Run ``argv``; on the wall limit or a cancel kill its process group and reap it first."""
    proc = await _start(
        argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        cwd=cwd,
        env=dict(env) if env is not None else None,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out = _Capture(limits.output_bytes, bytearray())
    err = _Capture(limits.output_bytes, bytearray())
    readers = [
        asyncio.create_task(out.read(proc.stdout)),
        asyncio.create_task(err.read(proc.stderr)),
        asyncio.create_task(_feed(proc, stdin)),
    ]
    timed_out = False
    try:
        try:
            async with asyncio.timeout(limits.wall_seconds):
                await proc.wait()
        except TimeoutError:
            timed_out = True
        # Anything still in the group (a background job of a shell) goes with the call; the
        # group id is ours until the last member is gone, so this cannot hit a stranger unless
        # every member was already reaped and the id reused in between.
        await kill_tree(proc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_SECONDS):
                await asyncio.gather(*readers, return_exceptions=True)
    except BaseException:
        # Cancelled (the turn, or the tool's timeout): the tree dies now (synchronously, so a
        # second cancel cannot stop it), and we reap it unless cancelled again, in which case
        # asyncio's child watcher does.
        if not kill_group(proc.pid):
            log.warning("process group %d still has live members after SIGKILL", proc.pid)
        await asyncio.shield(proc.wait())
        raise
    finally:
        for task in readers:
            task.cancel()
    status = proc.returncode
    assert status is not None
    sig: int | None = None
    if status < 0:
        sig, status = -status, 128 - status
    if timed_out:
        sig = signal.SIGKILL
    return Outcome(
        exit_status=status,
        signal=sig,
        stdout=bytes(out.data),
        stderr=bytes(err.data),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        timed_out=timed_out,
    )
