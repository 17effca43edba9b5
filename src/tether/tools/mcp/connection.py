"""One session's connection to one MCP server: a stdio process or an HTTP client of its own.

The SDK's transports are anyio context managers, whose cancel scopes must be left by the task
that entered them; a turn's task comes and goes, so each connection has a task of its own that
opens the transport and the MCP client, holds them until :meth:`Connection.close`, and then
leaves them (for stdio: closes the server's stdin, waits, then kills its process group). Turns
only send requests through the client, from whatever task they run in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO, TypeVar

import anyio
import anyio.to_thread
import httpx2
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tether.affinity import spread
from tether.errors import ToolError
from tether.records import Principal
from tether.tools.mcp.specs import McpHttp, McpServer, McpStdio, Wrap
from tether.version import __version__

T = TypeVar("T")

log = logging.getLogger("tether.mcp")

CLOSE_WAIT = 8.0
"""Seconds a connection's task may take to leave its transport (the stdio transport gives a
server 2 s to exit after its stdin closes, 2 more after SIGTERM, then kills it)."""
MAX_LIST_PAGES = 100
"""Pages of ``tools/list`` read at most: a server that pages forever cannot hang a turn."""
_HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)  # what the SDK's own default client uses
_CONNECTION_LOST = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    OSError,
    httpx2.HTTPError,
)


def reason(exc: BaseException) -> str:
    """One line saying what went wrong (the first failure inside an exception group)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _errlog() -> TextIO:
    # The server's stderr goes where tether's goes; a stand-in stream (a test's capture) has
    # no file descriptor to hand a child process.
    try:
        sys.stderr.fileno()
        return sys.stderr
    except (AttributeError, OSError, ValueError):
        return sys.__stderr__ or sys.stderr


class Connection:
    """An MCP client for one session and one server; see the module docstring."""

    def __init__(
        self,
        spec: McpServer,
        *,
        workspace: Path | None,
        principal: Principal,
        wrap: Wrap | None = None,
    ) -> None:
        self.spec = spec
        self.workspace = workspace
        self.principal = principal
        """Whose headers an HTTP connection carries; it serves nobody else."""
        self._wrap = wrap
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._tools: list[types.Tool] | None = None
        self.lost = False
        """The server went away (or never came): the session opens a new connection."""

    def serves(self, principal: Principal) -> bool:
        """Whether a turn of ``principal`` may use this connection: an HTTP one carries the
        headers of the principal who opened it; a stdio process holds no caller's credentials."""
        return isinstance(self.spec, McpStdio) or self.principal == principal

    async def open(self) -> None:
        """Start the server (or connect) and shake hands; ToolError saying why it could not."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"tether-mcp-{self.spec.name}")
        try:
            async with asyncio.timeout(self.spec.start_timeout):
                # Shielded: the timeout cancels the wait, never the future the task resolves.
                self._client = await asyncio.shield(ready)
        except BaseException as exc:
            self.lost = True
            await asyncio.shield(self.close(force=True))
            if isinstance(exc, TimeoutError):
                why = f"no answer within {self.spec.start_timeout:g} s"
                raise ToolError(self._failed(why)) from None
            if isinstance(exc, Exception):
                raise ToolError(self._failed(reason(exc))) from None
            raise

    def _failed(self, why: str) -> str:
        return f"MCP server {self.spec.name!r} could not be started: {why}"

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = await stack.enter_async_context(await self._client_of(stack))
                if ready.done():  # open() gave up meanwhile
                    return
                ready.set_result(client)
                await self._closing.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif not self._closing.is_set():
                log.warning("MCP server %s failed: %s", self.spec.name, reason(exc))
        finally:
            self.lost = True
            self._client = None

    async def _client_of(self, stack: contextlib.AsyncExitStack) -> Client:
        info = types.Implementation(name="tether", version=__version__)
        spec = self.spec
        if isinstance(spec, McpHttp):
            # A client of its own per connection: no cookie, pooled connection or header of one
            # caller is ever seen by another's requests.
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=spec.headers_for(self.principal), timeout=_HTTP_TIMEOUT)
            )
            return Client(
                streamable_http_client(spec.url, http_client=http), cache=None, client_info=info
            )
        if self.workspace is None:
            raise ToolError("no workspace to run it in")
        argv = list(spec.command)
        if self._wrap is not None:
            # In a thread: a sandbox's command may probe it (a short run) and hand the
            # workspace over (a walk of what the session wrote), neither for the event loop.
            argv = await anyio.to_thread.run_sync(self._wrap, argv, self.workspace)
        params = StdioServerParameters(
            command=argv[0],
            args=argv[1:],
            env=dict(spec.env) if spec.env is not None else None,
            cwd=self.workspace,
        )
        transport = _Spread(stdio_client(params, errlog=_errlog()))
        return Client(transport, cache=None, client_info=info)

    async def list_tools(self) -> list[types.Tool]:
        """The server's tools, read once per connection."""
        if self._tools is None:
            client = self._live()
            tools: list[types.Tool] = []
            cursor: str | None = None
            try:
                for _ in range(MAX_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    cursor = page.next_cursor
                    if cursor is None:
                        break
            except MCPError as exc:
                why = f"MCP server {self.spec.name!r} cannot list its tools: {exc}"
                raise ToolError(why) from None
            except _CONNECTION_LOST as exc:
                raise self._lost(exc) from None
            self._tools = tools
        return self._tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call ``tool``; ToolError when the server refuses or the connection is gone."""
        client = self._live()
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                raise self._lost(exc) from None
            raise ToolError(f"MCP server {self.spec.name!r} refused the call: {exc}") from None
        except _CONNECTION_LOST as exc:
            raise self._lost(exc) from None

    def _live(self) -> Client:
        if self._client is None or self.lost:
            raise ToolError(f"MCP server {self.spec.name!r} is not connected")
        return self._client

    def _lost(self, exc: BaseException) -> ToolError:
        self.lost = True
        return ToolError(
            f"MCP server {self.spec.name!r} went away ({reason(exc)}); it is started again on "
            "the next call"
        )

    async def close(self, *, force: bool = False) -> None:
        """Leave the client and the transport; a stdio server's process is gone on return (its
        task given :data:`CLOSE_WAIT` seconds, then cancelled). ``force``: cancel at once (a
        start that hangs in its handshake never looks at the close signal)."""
        self._closing.set()
        task = self._task
        if task is None or task.done():
            return
        if not force:
            await asyncio.wait([task], timeout=CLOSE_WAIT)
        if not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=CLOSE_WAIT)
        if not task.done():
            log.warning("MCP server %s did not stop within %g s", self.spec.name, 2 * CLOSE_WAIT)


class _Spread(AbstractAsyncContextManager[T]):
    """A stdio transport whose process, started from the event loop's thread, gets the CPUs
    the server has rather than the one that thread is pinned to (:mod:`tether.affinity`): only
    the start is spread, not the handshake after it."""

    def __init__(self, inner: AbstractAsyncContextManager[T]) -> None:
        self._inner = inner

    async def __aenter__(self) -> T:
        with spread():
            return await self._inner.__aenter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._inner.__aexit__(kind, exc, tb)
