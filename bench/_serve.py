"""A ``tether serve`` of the test apps for the benchmarks that need a real server process."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (``/proc/<pid>/stat``, fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def threads_cpu_ns(pid: int) -> int:
    """Nanoseconds on a CPU of every thread of ``pid`` (``/proc/<pid>/task/*/schedstat``):
    exact where ``/proc/<pid>/stat`` counts in 10 ms ticks, so it can be read around one turn.
    Only ``pid``'s own threads: not its children (``tether serve --workers N``'s workers)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with (
            contextlib.suppress(OSError, ValueError, IndexError),  # a thread gone meanwhile
            open(f"/proc/{pid}/task/{tid}/schedstat") as f,
        ):
            total += int(f.read().split()[0])
    return total


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the workers of ``tether serve --workers N``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_cpu(pid: int) -> dict[int, float]:
    """:func:`cpu_seconds` of ``pid`` and of each of its descendants still alive, by pid."""
    out: dict[int, float] = {}
    for p in descendants(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            out[p] = cpu_seconds(p)
    return out


class Served(str):
    """The server's URL, which also knows the server's pid (for its CPU time)."""

    pid: int


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(data_dir: Path, log: Path, *args: str) -> Iterator[Served]:
    """Serve ``tests.server.apps:app`` on ``data_dir`` until the block ends; yields its URL
    once ``/readyz`` answers 200. The checkout's own src comes first on the path."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    cmd = [sys.executable, "-m", "tether", "serve", "tests.server.apps:app", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir), "--log-level", "warning", *args]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    url = Served(f"http://127.0.0.1:{port}")
    url.pid = proc.pid
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"server did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
