"""The seam between the code and shell tools and whatever confines them.

A :class:`Sandbox` runs an argv in a session's workspace under :class:`Limits` and returns an
:class:`Outcome`; bubblewrap is the one real implementation today, and a container or microVM
runner only has to fill in the same four members. The threat model is in ``docs/sandbox.md``.
"""

from __future__ import annotations

import signal as signals
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class Limits:
    """What one sandboxed call may use. The rlimits hold per process, the rest per call."""

    cpu_seconds: int = 30
    """RLIMIT_CPU: CPU seconds of each process (SIGXCPU then, SIGKILL a second later)."""
    memory_bytes: int = 1024 * MIB
    """RLIMIT_AS: address space of each process (allocations fail past it)."""
    processes: int = 64
    """RLIMIT_NPROC: processes the sandbox's user may have at once (a fork bomb stops here)."""
    file_bytes: int = 64 * MIB
    """RLIMIT_FSIZE: the largest file a process may write (SIGXFSZ past it)."""
    open_files: int = 256
    """RLIMIT_NOFILE: file descriptors of each process."""
    wall_seconds: float = 60.0
    """Real time of the whole call; then the whole process tree is killed."""
    output_bytes: int = 64 * KIB
    """Bytes kept of stdout and of stderr each; the rest is read and dropped."""
    tmp_bytes: int = 64 * MIB
    """Size of the private tmpfs ``/tmp`` (memory, gone after the call)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a sandboxed call ended and what it printed."""

    exit_status: int
    """The exit status; 128+N when the process was killed by signal N (as shells report it)."""
    signal: int | None = None
    """The signal that ended it, when known (from the status, or the one we sent on timeout)."""
    stdout: bytes = b""
    """At most ``Limits.output_bytes`` of it."""
    stderr: bytes = b""
    stdout_bytes: int = 0
    """How many bytes it wrote to stdout in all (more than ``len(stdout)`` when truncated)."""
    stderr_bytes: int = 0
    timed_out: bool = False
    """The wall-clock limit (or a cancel) ended it: the tree was killed."""
    reason: str | None = None
    """Why it ended, in words, when a limit is the likely cause."""

    @property
    def stdout_truncated(self) -> bool:
        return self.stdout_bytes > len(self.stdout)

    @property
    def stderr_truncated(self) -> bool:
        return self.stderr_bytes > len(self.stderr)

    def render(self) -> str:
        """The tool's text result: the exit status always, then the reason and the output, each
        stream cut at its limit with a marker saying how much was dropped."""
        status = f"exit status: {self.exit_status}"
        if self.signal is not None:
            status += f" (killed by {_signal_name(self.signal)})"
        lines = [status]
        if self.reason:
            lines.append(f"limit: {self.reason}")
        for label, data, total in (
            ("stdout", self.stdout, self.stdout_bytes),
            ("stderr", self.stderr, self.stderr_bytes),
        ):
            if not total:
                continue
            text = data.decode("utf-8", errors="replace")
            if len(data) < total:
                text += (
                    f"\n[... output truncated: {total:,} bytes written, "
                    f"the first {len(data):,} shown]"
                )
            lines.append(f"{label}:\n{text}")
        return "\n".join(lines)


def _signal_name(number: int) -> str:
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


@runtime_checkable
class Sandbox(Protocol):
    """Runs commands confined to one workspace. Implementations hold no per-session state
    beyond caches (bubblewrap remembers when it last handed each workspace over)."""

    name: str

    def unavailable(self) -> str | None:
        """Why this sandbox cannot run here (a sentence for the operator), None when it can."""
        ...

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        stdin: bytes | None = None,
    ) -> Outcome:
        """Run ``argv`` in ``workspace`` to its end, the wall limit, or the caller's cancel; a
        cancel or timeout kills the whole process tree before this returns or raises."""
        ...

    def command(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        read_only: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """The argv that runs a long-lived ``argv`` (an MCP stdio server) inside the sandbox,
        without the wall limit. The caller starts it with ``start_new_session=True`` and kills
        its process group to stop it. ``read_only``: host paths the program needs (its
        interpreter, its script), visible inside at the same place, read-only; ``env``:
        variables set inside (the sandbox clears the caller's)."""
        ...


def rlimits(prlimit: str, limits: Limits, *, processes: bool = True) -> list[str]:
    """``prlimit`` with ``limits``, ending in ``--`` (the command follows). ``processes``:
    also the process limit, which counts a uid's processes across the host (left out when the
    command runs as tether's own user: it would starve tether itself)."""
    return [
        prlimit,
        # Soft below hard: the kernel sends SIGXCPU at the soft limit, which names the cause;
        # at soft = hard it would SIGKILL outright, which any killer could have sent. A program
        # that ignores SIGXCPU still dies at the hard limit, a second later.
        f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
        f"--as={limits.memory_bytes}",
        *([f"--nproc={limits.processes}"] if processes else []),
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
        "--",
    ]


def explain(outcome: Outcome, limits: Limits) -> Outcome:
    """The outcome with a ``reason`` naming the limit it most likely hit, if any.

    rlimit failures reach a program as ordinary errors (ENOMEM, EAGAIN), so the signs are read
    from the status and stderr; the words say "probably" where the evidence is indirect.
    """
    reason = outcome.reason
    err = outcome.stderr.decode("utf-8", errors="replace")
    if outcome.timed_out:
        reason = (
            f"the wall-clock limit of {limits.wall_seconds:g} s was reached; "
            "the whole process tree was killed"
        )
    elif outcome.signal == signals.SIGXCPU or (
        outcome.signal == signals.SIGKILL and "CPU time limit" in err
    ):
        reason = f"the CPU time limit of {limits.cpu_seconds} s per process was reached"
    elif outcome.signal == signals.SIGXFSZ or "File too large" in err:
        reason = f"the file size limit of {limits.file_bytes:,} bytes was reached"
    elif ("fork" in err and "Resource temporarily unavailable" in err) or "Cannot fork" in err:
        # Before the memory signs: once a fork bomb's first shell is gone, the forks still
        # under way in its pid namespace fail with ENOMEM ("fork: Cannot allocate memory"),
        # which is no memory limit.
        reason = f"probably the process limit ({limits.processes} processes)"
    elif "MemoryError" in err or "Cannot allocate memory" in err or "bad_alloc" in err:
        reason = (
            f"probably the memory limit of {limits.memory_bytes:,} bytes of address space "
            "per process"
        )
    elif "Too many open files" in err:
        reason = f"the open files limit ({limits.open_files}) was reached"
    if reason == outcome.reason:
        return outcome
    return replace(outcome, reason=reason)
