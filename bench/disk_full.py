"""``tether serve`` on SQLite when its disk fills up, and after space comes back.

Reproduce (from the repository root, as root: it mounts a tmpfs)::

    .venv/bin/python bench/disk_full.py               # a 40 MB tmpfs under a temporary dir
    .venv/bin/python bench/disk_full.py --size-mb 64
    .venv/bin/python bench/disk_full.py --dir /mnt/small   # an existing small filesystem instead

A real ``tether serve`` (the test apps' ``echo`` agent, scripted, no model download) keeps its
data directory on the small filesystem. The script does a turn, then fills the filesystem with a
filler file beside the database, and then, with a 60 s client timeout on every request: uploads
a 2 MB document (the write that needs new space), does a turn, lists sessions, asks
``/healthz`` and ``/readyz``. It deletes the filler file, waits up to 30 s for ``/readyz``, and
does the upload and the turn again. Every line says what the client got and how long it took;
``timeout`` means no answer within 60 s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from _serve import serve as run_server

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60.0


@contextlib.contextmanager
def tmpfs(size_mb: int) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tether-disk-full-") as tmp:
        mnt = Path(tmp) / "mnt"
        mnt.mkdir()
        options = f"size={size_mb}m"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)


@contextlib.contextmanager
def serve(data_dir: Path) -> Iterator[str]:
    log = Path(tempfile.gettempdir()) / f"tether-disk-full-{os.getpid()}.log"
    try:
        with run_server(data_dir, log) as url:
            yield url
    finally:
        print(f"(server log: {log})")


def fill(folder: Path) -> Path:
    """A file beside the database that takes every free block (unbuffered: nothing is left to
    flush on close)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def step(label: str, call: Callable[[], httpx.Response]) -> None:
    start = time.monotonic()
    try:
        r = call()
        kind = ""
        if r.headers.get("content-type", "").startswith("application/problem+json"):
            kind = " " + str(r.json().get("type", "")).rsplit("/", 1)[-1]
        got = f"{r.status_code}{kind}"
    except httpx.TimeoutException:
        got = "timeout"
    except httpx.TransportError as exc:
        got = type(exc).__name__
    print(f"  {label:<34} {got:<26} {time.monotonic() - start:7.2f} s", flush=True)


def run(data_dir: Path) -> None:
    doc = ("# notes\n\n" + "lorem ipsum dolor sit amet " * 80 + "\n\n") * 1000
    body = doc.encode()[: 2 * 1024 * 1024]
    with serve(data_dir) as url, httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        r = c.post("/v1/sessions", json={"agent": "echo", "session_id": "s1"})
        assert r.status_code == 201, r.text

        def turn() -> httpx.Response:
            return c.post("/v1/sessions/s1/turns", json={"input": "hello"})

        def up() -> httpx.Response:
            return c.post("/v1/knowledge/notes/documents", files={"file": ("n.md", body)})

        print("space left:")
        step("POST turn", turn)
        filler = fill(data_dir)
        print(f"full ({os.statvfs(data_dir).f_bavail * os.statvfs(data_dir).f_frsize} bytes free):")
        step("POST document (2 MB)", up)
        step("POST turn", turn)
        step("GET /v1/sessions", lambda: c.get("/v1/sessions"))
        step("GET /healthz", lambda: c.get("/healthz"))
        step("GET /readyz", lambda: c.get("/readyz"))
        filler.unlink()
        print("filler deleted:")
        start = time.monotonic()
        status = "timeout"
        while time.monotonic() - start < 30:
            try:
                status = str(c.get("/readyz", timeout=5).status_code)
            except httpx.TimeoutException:
                status = "timeout"
            if status == "200":
                break
            time.sleep(0.2)
        print(f"  {'GET /readyz until 200':<34} {status:<26} {time.monotonic() - start:7.2f} s")
        step("POST document (2 MB)", up)
        step("POST turn", turn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=40, help="size of the tmpfs (default 40)")
    parser.add_argument("--dir", type=Path, help="an existing small filesystem to use instead")
    args = parser.parse_args()
    if args.dir is not None:
        run(args.dir / "tether-data")
        return
    with tmpfs(args.size_mb) as mnt:
        run(mnt / "tether-data")


if __name__ == "__main__":
    main()
