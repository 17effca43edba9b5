"""No sandbox: commands run as tether's own user, in the workspace directory, with rlimits.

Only for an operator who says so (``sandbox="none"``): the command sees the whole host, its
network and every file tether can read, the data dir included. The rlimits, the wall limit and
the kill of its process group still apply; a process that starts its own session escapes that
kill. A warning is logged when one is made.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from tether.tools.sandbox.base import Limits, Outcome, explain, rlimits
from tether.tools.sandbox.process import run_process

log = logging.getLogger("tether.sandbox")


class Unsandboxed:
    """Runs commands unconfined (the operator's explicit choice), rlimits applied."""

    name = "none"

    def __init__(self) -> None:
        self.prlimit = shutil.which("prlimit")
        log.warning(
            "sandbox='none': code and shell tools run UNSANDBOXED as this process's user, with "
            "its network and every file it can read; use bubblewrap unless you trust every caller"
        )

    def unavailable(self) -> str | None:
        return None

    def command(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        read_only: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """As the protocol says; ``read_only`` means nothing here (the host is all visible),
        and ``env`` is the caller's to give the process (nothing clears it here)."""
        if self.prlimit is None:
            return list(argv)
        # No process limit: counted per user across the host, it would starve tether itself.
        return [*rlimits(self.prlimit, limits, processes=False), *argv]

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        stdin: bytes | None = None,
    ) -> Outcome:
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(workspace), "LANG": "C.UTF-8"}
        outcome = await run_process(
            self.command(argv, workspace=workspace, limits=limits),
            limits=limits,
            cwd=workspace,
            env=env,
            stdin=stdin,
        )
        return explain(outcome, limits)
