"""Tools: typed functions the model may call."""

from tether.tools.context import ToolContext
from tether.tools.tool import Tool, tool

__all__ = ["Tool", "ToolContext", "tool"]
