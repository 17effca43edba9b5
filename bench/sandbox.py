"""What a sandboxed ``shell`` or ``run_python`` call costs before the program does anything.

Reproduce (from the repository root)::

    .venv/bin/python bench/sandbox.py            # 200 calls per row, ~30 s on 2 cores
    .venv/bin/python bench/sandbox.py --calls 50 # quicker

Each row runs one command ``--calls`` times in a row through the same path the tools use
(:func:`tether.tools.sandbox.process.run_process`: an asyncio subprocess in its own session,
pipes read concurrently), plainly and through :class:`Bubblewrap` (namespaces, mounts,
``prlimit``, and as root ``setpriv`` and the workspace hand-over), and prints p50/p99 wall ms
per call and the overhead of the sandbox at p50.

The last rows run ``true`` in a session's workspace holding ``--files`` files (a small
project's worth): through :class:`Bubblewrap`, whose hand-over to the session's uid (as root)
looks at the tree before each call, and as the whole ``shell`` tool call, which also measures
the workspace against its quota afterwards. They start a second after a first, untimed call,
as calls a model step apart do: within a second of the last hand-over, the directories it
chowned are looked into again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.tools import ToolContext
from tether.tools.sandbox import Bubblewrap, Limits, Outcome, sandbox_tools
from tether.tools.sandbox.process import run_process
from tether.tools.workspace import ensure_workspace, workspace_dir

COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


async def _time_calls(calls: int, one: Callable[[], Awaitable[Outcome | str]]) -> list[float]:
    times: list[float] = []
    for _ in range(calls):
        started = time.perf_counter()
        outcome = await one()
        times.append((time.perf_counter() - started) * 1000)
        if isinstance(outcome, Outcome):
            assert outcome.exit_status == 0, outcome.render()
        else:
            assert outcome.startswith("exit status: 0"), outcome
    return times


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _row(label: str, runner: str, times: list[float]) -> None:
    print(
        f"{label:22} {runner:12} {_p(times, 0.5):8.2f} {_p(times, 0.99):8.2f} "
        f"{statistics.fmean(times):8.2f}"
    )


def _fill(workspace: Path, files: int) -> None:
    """``files`` files of 2 KiB, 50 to a directory, two levels deep (``src/pkg3/mod17.py``)."""
    for n in range(files):
        d = workspace / "src" / f"pkg{n // 50}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{n % 50}.py").write_bytes(b"#" * 2048)


async def main(calls: int, files: int) -> None:
    box = Bubblewrap()
    why = box.unavailable()
    if why is not None:
        raise SystemExit(f"bubblewrap unusable here: {why}")
    limits = Limits()
    # The sandbox's PATH, so both rows run the same /usr/bin programs (not a pyenv shim).
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    print(f"load average {os.getloadavg()[0]:.2f}, {calls} calls per row, root={box.privileged}")
    print(f"{'command':22} {'runner':12} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp)
        for label, argv in COMMANDS.items():
            plain = await _time_calls(
                calls, partial(run_process, argv, limits=limits, cwd=workspace, env=env)
            )
            boxed = await _time_calls(
                calls, partial(box.run, argv, workspace=workspace, limits=limits)
            )
            _row(label, "subprocess", plain)
            _row(label, "bubblewrap", boxed)
            print(f"{'':22} {'overhead':12} {_p(boxed, 0.5) - _p(plain, 0.5):8.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        key = SessionKey(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user, "bench")
        big = ensure_workspace(workspace_dir(Path(tmp), key))
        _fill(big, files)
        label = f"true, {files:,} files"
        await box.run(["true"], workspace=big, limits=limits)  # the files handed over
        await asyncio.sleep(1.1)
        boxed = await _time_calls(calls, lambda: box.run(["true"], workspace=big, limits=limits))
        _row(label, "bubblewrap", boxed)
        (shell,) = [t for t in sandbox_tools(box, requires_approval=False) if t.name == "shell"]
        ctx = ToolContext(
            session=key,
            principal=LOCAL_PRINCIPAL,
            turn_id="t",
            call_id="c",
            cancelled=asyncio.Event(),
            workspace=big,
        )
        command = json.dumps({"command": "true"})
        tool = await _time_calls(calls, lambda: shell.invoke(command, ctx))
        _row(label, "shell tool", tool)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--files", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.files))
