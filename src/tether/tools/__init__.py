"""Tools: typed functions the model may call."""

from tether.tools.context import ToolContext
from tether.tools.files import FILE_TOOLS, READ_ONLY_FILE_TOOLS
from tether.tools.sandbox import SANDBOX_TOOLS, Limits, Sandbox, sandbox_tools
from tether.tools.tool import Tool, tool

__all__ = [
    "FILE_TOOLS",
    "READ_ONLY_FILE_TOOLS",
    "SANDBOX_TOOLS",
    "Limits",
    "Sandbox",
    "Tool",
    "ToolContext",
    "sandbox_tools",
    "tool",
]
