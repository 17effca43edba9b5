"""What a sandboxed ``shell`` or ``run_python`` call costs before the program does anything.

Reproduce (from the repository root)::

    .venv/bin/python bench/sandbox.py            # 200 calls per row, ~30 s on 2 cores
    .venv/bin/python bench/sandbox.py --calls 50 # quicker

Each row runs one command ``--calls`` times in a row through the same path the tools use
(:func:`tether.tools.sandbox.process.run_process`: an asyncio subprocess in its own session,
pipes read concurrently), plainly and through :class:`Bubblewrap` (namespaces, mounts,
``prlimit``, and as root ``setpriv`` and the workspace hand-over), and prints p50/p99 wall ms
per call and the overhead of the sandbox at p50.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from tether.tools.sandbox import Bubblewrap, Limits
from tether.tools.sandbox.process import run_process

COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


async def _time_calls(calls: int, one: object) -> list[float]:
    assert callable(one)
    times: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        outcome = await one()
        times.append((time.perf_counter() - started) * 1000)
        assert outcome.exit_status == 0, outcome.render()
    return times


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(calls: int) -> None:
    box = Bubblewrap()
    why = box.unavailable()
    if why is not None:
        raise SystemExit(f"bubblewrap unusable here: {why}")
    limits = Limits()
    # The sandbox's PATH, so both rows run the same /usr/bin programs (not a pyenv shim).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    print(f"load average {os.getloadavg()[0]:.2f}, {calls} calls per row, root={box.privileged}")
    print(f"{'command':18} {'runner':12} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        for label, argv in COMMANDS.items():
            plain = await _time_calls(
                calls, lambda argv=argv: run_process(argv, limits=limits, cwd=workspace, env=env)
            )
            boxed = await _time_calls(
                calls, lambda argv=argv: box.run(argv, workspace=workspace, limits=limits)
            )
            for runner, times in (("subprocess", plain), ("bubblewrap", boxed)):
                print(
                    f"{label:18} {runner:12} {_p(times, 0.5):8.2f} {_p(times, 0.99):8.2f} "
                    f"{statistics.fmean(times):8.2f}"
                )
            print(f"{'':18} {'overhead':12} {_p(boxed, 0.5) - _p(plain, 0.5):8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    asyncio.run(main(parser.parse_args().calls))
