"""Run one process tree to its end, its wall limit or a cancel, and never leave it behind.

The process starts in a session of its own, so its process group holds it and everything it
forks that does not leave the group; a timeout or a cancel sends SIGKILL to the whole group.
Under bubblewrap that group is bwrap itself: its pid-1 child dies with it (``--die-with-parent``)
and the kernel kills everything else in the pid namespace, so no descendant survives even one
that called ``setsid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tether.tools.sandbox.base import Limits, Outcome

_DRAIN_SECONDS = 1.0
"""After the process exits, how long its pipes may stay open (held by a straggler) before we
stop reading."""
_CHUNK = 64 * 1024


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


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


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
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        start_new_session=True,
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
        _kill_group(proc)
        await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_DRAIN_SECONDS):
                await asyncio.gather(*readers, return_exceptions=True)
    except BaseException:
        # Cancelled (the turn, or the tool's timeout): the tree dies now, and we reap it unless
        # cancelled again, in which case asyncio's child watcher reaps it.
        _kill_group(proc)
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
