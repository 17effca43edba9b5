"""How ``tether serve --workers 2`` shares its connections, and what a new connection costs.

Reproduce (from the repository root)::

    .venv/bin/python bench/workers_split.py               # ~1 min
    .venv/bin/python bench/workers_split.py --bursts 10 --requests 8000

Two rows, against ``tether serve --workers 2`` (SQLite, a temporary data directory):

* ``split``: 64 clients of one keep-alive connection each connect at once (``GET /healthz``,
  which names the worker that answered), ``--bursts`` times; how many each worker got. The
  parent hands connections to the workers in turn, to those that have room
  (``tether.server.handed``): near 32/32 when both are as free; when the workers accepted on a
  shared socket, the one awake first took most (57/7, 64/0).
* ``new connection a request``: ``--requests`` ``GET /healthz`` from 16 clients that open a new
  connection for each; requests a second, and CPU a request of the whole server and of the
  parent alone (its accept and hand-over). Clients that keep their connections pay it once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp

from _serve import tree_cpu
from http_load import fake_model, tether_serve


async def burst(url: str) -> Counter[str]:
    """64 keep-alive clients connecting at once: the workers that answered, and how often."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), trust_env=False)
            )
            for _ in range(64)
        ]

        async def node(client: aiohttp.ClientSession) -> str:
            async with client.get(f"{url}/healthz") as r:
                answer: str = (await r.json())["node"]
                return answer

        return Counter(await asyncio.gather(*(node(c) for c in clients)))


async def churn(url: str, pid: int, requests: int) -> tuple[float, float, float]:
    """Requests a second, and CPU ms a request of the server and of its parent alone, with a
    new connection for every request."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as client:

        async def worker(n: int) -> None:
            for _ in range(n):
                async with client.get(f"{url}/healthz") as r:
                    await r.read()

        await asyncio.gather(*(worker(20) for _ in range(16)))  # warm-up
        cpu0, wall0 = tree_cpu(pid), time.perf_counter()
        await asyncio.gather(*(worker(requests // 16) for _ in range(16)))
        wall, cpu1 = time.perf_counter() - wall0, tree_cpu(pid)
    done = requests // 16 * 16
    total = sum(cpu1[p] - cpu0.get(p, 0.0) for p in cpu1)
    return done / wall, 1000 * total / done, 1000 * (cpu1[pid] - cpu0[pid]) / done


async def main_async(args: argparse.Namespace) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="tether-workers-split-") as tmp,
        fake_model(0) as (_, fake_url),
        tether_serve(fake_url, Path(tmp) / "data", "--workers", "2") as (proc, url, _),
    ):
        await asyncio.sleep(1.0)  # /readyz answers once one worker serves: let both start
        splits = [sorted((await burst(url)).values(), reverse=True) for _ in range(args.bursts)]
        print("split of 64 keep-alive connections (per burst, most first):")
        print("  " + "  ".join("/".join(map(str, s)) for s in splits))
        busier = [s[0] for s in splits]
        print(
            f"  the busier worker's share: worst {max(busier)}/64, "
            f"mean {statistics.mean(busier):.1f}/64"
        )
        rate, cpu, parent = await churn(url, proc.pid, args.requests)
        print(
            f"new connection a request: {rate:,.0f} requests/s, CPU {cpu:.3f} ms a request, "
            f"of which the parent (accept and hand-over) {parent:.3f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bursts", type=int, default=5)
    parser.add_argument("--requests", type=int, default=4000)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
