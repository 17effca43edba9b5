"""MCP servers as tools: ``Agent(mcp=[McpStdio(...), McpHttp(...)])``.

Each session has its own connection to each of its agent's servers (a stdio process started in
its workspace, or an HTTP client with its caller's headers), opened on its first turn that needs
the tools and closed with the session (:class:`McpSessions`). The server's tools reach the model
as ``<server>__<tool>``; their results are data from the named server, never instructions.

Importing this package is light: the MCP SDK loads when a session first connects to a server.
"""

from tether.tools.mcp.sessions import McpSessions
from tether.tools.mcp.specs import HeadersFor, McpHttp, McpServer, McpStdio, Wrap

__all__ = ["HeadersFor", "McpHttp", "McpServer", "McpSessions", "McpStdio", "Wrap"]
