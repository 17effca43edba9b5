"""A PDF bomb against knowledge ingestion: what it costs to be handed one, in-process and over HTTP.

Reproduce (from the repository root)::

    .venv/bin/python bench/pdf_bomb.py               # both parts, default bounds
    .venv/bin/python bench/pdf_bomb.py --pages 50    # the bomb's size (default 50 pages)
    .venv/bin/python bench/pdf_bomb.py --no-http     # parse + chunk only

The bomb (``tests/memory/pdf_bomb.py``) is a ~11 KB PDF whose 50 pages all draw one shared
content stream: 11 million characters of text.

1. **In-process**: ``parse_and_chunk`` with the default bounds (``IngestLimits()``); wall time,
   characters and chunks it got to (or the error that stopped it) and this process's peak RSS.
2. **HTTP**: a fresh ``tether serve`` (SQLite in a temporary directory, default settings) is
   sent the bomb as a multipart upload: the status and time of the answer, the server's peak
   RSS (``VmHWM``), the database's size and the documents stored afterwards.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.memory.pdf_bomb import content_stream_bomb  # noqa: E402


def in_process(data: bytes) -> None:
    from tether.memory import documents

    started = time.perf_counter()
    try:
        budget = documents.Budget("bomb.pdf", documents.IngestLimits())
        parsed, chunks = documents.parse_and_chunk("bomb.pdf", data, None, budget)
        outcome = f"parsed: {sum(map(len, parsed.pages)):,} chars, {len(chunks):,} chunks"
    except Exception as exc:  # the bound that stopped it, or whatever else
        outcome = f"{type(exc).__name__}: {exc}"
    elapsed = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"in-process: {elapsed:.2f} s, peak RSS {peak:.0f} MB; {outcome}")


def _peak_rss(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return f"{int(line.split()[1]) / 1024:.0f} MB"
    return "?"


def over_http(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        port = 18000 + os.getpid() % 1000
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
        cmd = [sys.executable, "-m", "tether", "serve", "--port", str(port), "--data-dir", tmp]
        with open(Path(tmp) / "server.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                try:
                    if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            before = _peak_rss(proc.pid)
            started = time.perf_counter()
            r = httpx.post(
                url + "/v1/knowledge/kb/documents",
                files={"file": ("bomb.pdf", data, "application/pdf")},
                timeout=900,
            )
            elapsed = time.perf_counter() - started
            body = r.json()
            told = body.get("detail") or f"{body.get('chars')} chars, {body.get('chunks')} chunks"
            stored = httpx.get(url + "/v1/knowledge/kb/documents", timeout=30).json()["data"]
            size = sum(f.stat().st_size for f in Path(tmp).glob("tether.db*"))
            print(
                f"http: {r.status_code} in {elapsed:.2f} s ({told}); server peak RSS {before} idle,"
                f" {_peak_rss(proc.pid)} after; database {size / 1e6:.1f} MB;"
                f" {len(stored)} document(s) stored"
            )
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=50)
    parser.add_argument("--no-http", action="store_true")
    args = parser.parse_args()
    data = content_stream_bomb(pages=args.pages)
    print(f"bomb: {len(data):,} bytes, {args.pages} pages sharing one content stream")
    in_process(data)
    if not args.no_http:
        over_http(data)


if __name__ == "__main__":
    main()
