"""``run_python`` and ``shell``: code the model writes, run in the session's sandboxed workspace.

Both ask for approval by default. Without a working sandbox they refuse (a ToolError the
model reads); they run unconfined only when the operator passes ``sandbox="none"``.
"""

from __future__ import annotations

import asyncio
import shutil
from typing import Literal

import anyio.to_thread

from tether.errors import ConfigError, ToolError
from tether.tools.context import ToolContext
from tether.tools.sandbox.base import Limits, Sandbox
from tether.tools.sandbox.bubblewrap import Bubblewrap
from tether.tools.sandbox.none import Unsandboxed
from tether.tools.tool import Tool, tool
from tether.tools.workspace import ensure_workspace, usage

SandboxChoice = Literal["bubblewrap", "none"] | Sandbox
_TIMEOUT_GRACE = 5.0
"""The tool's own timeout sits this far past the wall limit, so the limit (which reports what
the program printed) fires first and the tool timeout only backs it up."""


def make_sandbox(choice: SandboxChoice) -> Sandbox:
    """``"bubblewrap"``, ``"none"`` (unconfined, logged as a warning) or a Sandbox of your own."""
    if choice == "bubblewrap":
        return Bubblewrap()
    if choice == "none":
        return Unsandboxed()
    if isinstance(choice, Sandbox):
        return choice
    raise ConfigError(f"sandbox must be 'bubblewrap', 'none' or a Sandbox, not {choice!r}")


async def _execute(
    box: Sandbox, limits: Limits, argv: list[str], ctx: ToolContext, stdin: bytes | None = None
) -> str:
    if ctx.workspace is None:
        raise ToolError("this tool needs the session's workspace, and this call has none")
    reason = await anyio.to_thread.run_sync(box.unavailable)
    if reason is not None:
        raise ToolError(
            f"no sandbox is available, so this code was not run: {reason}. "
            "Running it unsandboxed needs the operator's explicit sandbox='none'."
        )
    workspace = await anyio.to_thread.run_sync(ensure_workspace, ctx.workspace)
    run = asyncio.create_task(box.run(argv, workspace=workspace, limits=limits, stdin=stdin))
    stop = asyncio.create_task(ctx.cancelled.wait())
    try:
        await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # Cancelled outright, or told to stop: either way the run's own cancel handling kills
        # its process tree, and we wait for that before going on.
        stop.cancel()
        if not run.done():
            run.cancel()
            await asyncio.wait({run})
    if run.cancelled():
        raise ToolError("the call was cancelled; its process tree was killed")
    text = run.result().render()
    # A disk quota cannot be enforced inside the sandbox; it is checked after the call.
    try:
        held = await anyio.to_thread.run_sync(usage, workspace)
    except ToolError as exc:  # too deep to measure: the call ran, its result still counts
        return f"{text}\nworkspace: {exc}"
    if held > ctx.workspace_quota:
        text += (
            f"\nworkspace: {held:,} bytes, over its quota of {ctx.workspace_quota:,} bytes; "
            "delete files to make room"
        )
    return text


def sandbox_tools(
    sandbox: SandboxChoice = "bubblewrap",
    *,
    limits: Limits | None = None,
    requires_approval: bool = True,
) -> tuple[Tool, Tool]:
    """``(run_python, shell)`` running in ``sandbox`` under ``limits``."""
    box = make_sandbox(sandbox)
    lim = limits or Limits()
    shell_program = "bash" if shutil.which("bash") else "sh"
    described = (
        f"It runs in the session's workspace (/workspace, kept between calls) with no network, "
        f"a read-only system and a private /tmp, for at most {lim.wall_seconds:g} s; output "
        f"past {lim.output_bytes:,} bytes per stream is cut."
    )

    @tool(
        name="run_python",
        description=f"Run a Python 3 program and return its exit status and output. {described}",
        requires_approval=requires_approval,
        timeout=lim.wall_seconds + _TIMEOUT_GRACE,
    )
    async def run_python(code: str, ctx: ToolContext) -> str:
        """Args:
        code: The program's source, run as a script by python3.
        """
        return await _execute(box, lim, ["python3", "-"], ctx, stdin=code.encode())

    @tool(
        name="shell",
        description=f"Run a {shell_program} command line and return its exit status and "
        f"output. {described}",
        requires_approval=requires_approval,
        timeout=lim.wall_seconds + _TIMEOUT_GRACE,
    )
    async def shell(command: str, ctx: ToolContext) -> str:
        """Args:
        command: The command line, run by the shell in the workspace.
        """
        return await _execute(box, lim, [shell_program, "-c", command], ctx)

    return run_python, shell


SANDBOX_TOOLS = sandbox_tools()
"""``run_python`` and ``shell`` under bubblewrap with the default limits, asking for approval."""
