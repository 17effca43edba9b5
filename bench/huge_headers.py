"""Huge request heads against ``tether serve``: time to answer, what the client got, server RSS,
and how long ``/healthz`` stalls meanwhile.

Reproduce (from the repository root)::

    .venv/bin/python bench/huge_headers.py                     # 1 x 100 MB, then 4 x 100 MB
    .venv/bin/python bench/huge_headers.py --mb 5 --parallel 1 2 4
    .venv/bin/python bench/huge_headers.py --kind url          # a huge request line instead

One ``tether serve`` (default agent, a temporary data dir, local mode on 127.0.0.1) per row. For
each row, ``--parallel`` clients each open a raw socket and send ``GET /v1/agents`` with an
``X-API-Key`` of ``--mb`` megabytes (or a path that long, ``--kind url``), in 64 KiB writes, then
read the answer. Meanwhile a prober asks ``/healthz`` every 20 ms on fresh connections. Printed:
the slowest client's time to its status line, the statuses seen (``reset`` when the server cut
the connection before answering), the slowest ``/healthz`` while the clients ran, the server's
``VmRSS`` before, at its highest (sampled every 10 ms) and after, and ``VmHWM``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 64 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def proc_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def start(data_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    }
    cmd = [sys.executable, "-m", "tether", "serve", "--port", str(port)]
    cmd += ["--data-dir", str(data_dir), "--model", "openai:none", "--log-level", "error"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc, port
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def huge_request(port: int, size: int, kind: str, out: list[tuple[float, str]]) -> None:
    started = time.monotonic()
    status = "reset"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=300) as s:
            if kind == "url":
                head = b"GET /v1/agents?q="
                tail = b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            else:
                head = b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: "
                tail = b"\r\n\r\n"
            s.sendall(head)
            block = b"a" * CHUNK
            sent = 0
            try:
                while sent < size:
                    n = min(CHUNK, size - sent)
                    s.sendall(block[:n])
                    sent += n
                s.sendall(tail)
            except OSError:
                pass  # the server answered early and closed: read what it said
            line = s.makefile("rb").readline()
            if line:
                status = line.split()[1].decode()
    except OSError:
        pass
    out.append((time.monotonic() - started, status))


def probe(port: int, stop: threading.Event, worst: list[float]) -> None:
    while not stop.is_set():
        t = time.monotonic()
        with contextlib.suppress(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=60)
        worst.append(time.monotonic() - t)
        time.sleep(0.02)


def row(size_mb: float, parallel: int, kind: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start(Path(tmp))
        try:
            time.sleep(0.5)
            before = proc_kb(proc.pid, "VmRSS")
            peak = before
            results: list[tuple[float, str]] = []
            health: list[float] = []
            stop = threading.Event()
            prober = threading.Thread(target=probe, args=(port, stop, health))
            prober.start()
            clients = [
                threading.Thread(
                    target=huge_request, args=(port, int(size_mb * 1024 * 1024), kind, results)
                )
                for _ in range(parallel)
            ]
            for c in clients:
                c.start()
            while any(c.is_alive() for c in clients):
                peak = max(peak, proc_kb(proc.pid, "VmRSS"))
                time.sleep(0.01)
            stop.set()
            prober.join()
            time.sleep(0.5)
            after = proc_kb(proc.pid, "VmRSS")
            hwm = proc_kb(proc.pid, "VmHWM")
            ok = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    slowest = max(t for t, _ in results)
    statuses = ",".join(sorted({s for _, s in results}))
    return (
        f"{kind:6} {size_mb:7.1f} MB x{parallel}: answered {statuses:5} in {slowest:7.2f} s | "
        f"/healthz worst {max(health) * 1000:7.0f} ms, after: {ok} | RSS MB before "
        f"{before / 1024:6.1f} peak {peak / 1024:7.1f} after {after / 1024:7.1f} "
        f"(VmHWM {hwm / 1024:7.1f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--kind", choices=["header", "url"], default="header")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
    for n in args.parallel:
        print(row(args.mb, n, args.kind), flush=True)


if __name__ == "__main__":
    main()
