"""Sandboxed execution: the ``Sandbox`` seam, bubblewrap, and the code and shell tools."""

from tether.tools.sandbox.base import Limits, Outcome, Sandbox
from tether.tools.sandbox.bubblewrap import Bubblewrap
from tether.tools.sandbox.none import Unsandboxed
from tether.tools.sandbox.tools import SANDBOX_TOOLS, SandboxChoice, make_sandbox, sandbox_tools

__all__ = [
    "SANDBOX_TOOLS",
    "Bubblewrap",
    "Limits",
    "Outcome",
    "Sandbox",
    "SandboxChoice",
    "Unsandboxed",
    "make_sandbox",
    "sandbox_tools",
]
