"""Every session's open MCP connections in this process, and when they close.

A session's servers start on its first turn that needs the agent's tools and stay open for
its next turns (their tool lists read once). They close when the session is deleted or
expires (the scheduler calls :meth:`McpSessions.close_sessions`), when its user is forgotten,
when the session has been idle for ``idle_timeout``, when more than ``max_sessions`` sessions
hold connections (the least recently used goes), and when the runtime closes. A turn that
finds its session's servers closed (evicted while it waited on the model, say) starts them
again: eviction costs a restart, never a failed call.

Connections are node-local: a session whose turns move to another process starts its servers
there, and the first process closes its own when they go idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.errors import ConfigError, ToolError
from tether.records import Principal, SessionKey
from tether.tools.context import ToolContext
from tether.tools.mcp.specs import McpServer, McpStdio, Wrap
from tether.tools.sandbox import Limits, Sandbox, SandboxChoice, Unsandboxed, make_sandbox
from tether.tools.tool import Tool, schema_tool
from tether.tools.workspace import ensure_workspace

if TYPE_CHECKING:
    # The SDK (and its HTTP client) takes a good part of a second to import: only a process
    # whose agents use MCP servers pays for it, when the first one starts.
    import mcp_types as types

    from tether.tools.mcp.connection import Connection

log = logging.getLogger("tether.mcp")

DEFAULT_IDLE_TIMEOUT = 300.0
DEFAULT_MAX_SESSIONS = 64
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(eq=False)
class _Session:
    key: SessionKey
    connections: dict[str, Connection] = field(default_factory=dict)
    tools: dict[str, tuple[Tool, ...]] = field(default_factory=dict)
    """Server name → the tools made from its connection's listing."""
    last_used: float = field(default_factory=time.monotonic)
    calls: int = 0
    """Calls and listings in flight: a session making one is never idle."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a connection opens or the session closes: no server starts for a session
    being closed, and none twice."""
    closed: bool = False


class McpSessions:
    """The MCP connections of this process's sessions, keyed by session.

    Stdio servers run in ``sandbox`` (DESIGN §7: per-session subprocesses live in the same
    sandbox as the code tools): bubblewrap by default, with ``limits`` (no wall limit: they
    are long-lived), seeing the workspace, ``/usr`` and the server's own ``read_only`` paths.
    No sandbox available → the server does not start, and the model is told why. ``"none"``
    (the operator's explicit choice, logged as a warning) runs them unconfined, with the
    workspace as their working directory and a minimal environment. ``wrap(argv, workspace)
    -> argv``, when given, replaces all of that with a confinement of your own.
    """

    def __init__(
        self,
        *,
        sandbox: SandboxChoice = "bubblewrap",
        limits: Limits | None = None,
        wrap: Wrap | None = None,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:
        if not idle_timeout > 0:
            raise ConfigError("MCP idle_timeout must be a positive number of seconds")
        if max_sessions < 1:
            raise ConfigError("MCP max_sessions must be at least 1")
        self.wrap = wrap
        self.sandbox: Sandbox | None = None if wrap is not None else make_sandbox(sandbox)
        """Where stdio servers run (None: ``wrap`` says)."""
        self.limits = limits or Limits()
        self._unavailable: tuple[str | None] | None = None
        self.idle_timeout = idle_timeout
        """Seconds a session's servers stay open with no call and no turn asking for them."""
        self.max_sessions = max_sessions
        """Sessions that may hold connections at once; the least recently used closes."""
        self._sessions: OrderedDict[SessionKey, _Session] = OrderedDict()
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    def _wrap_for(self, spec: McpStdio) -> Wrap | None:
        """How ``spec``'s command is confined: ``wrap``, the sandbox, or (``"none"``) not."""
        box = self.sandbox
        if self.wrap is not None or box is None:
            return self.wrap
        if isinstance(box, Unsandboxed):
            return None  # as it is: the operator chose no sandbox

        def confined(argv: list[str], workspace: Path) -> list[str]:
            if self._unavailable is None:
                self._unavailable = (box.unavailable(),)  # probed once: a short bwrap run
            reason = self._unavailable[0]
            if reason is not None:
                raise ToolError(
                    f"no sandbox to run it in ({reason}); an operator who trusts it may run "
                    "MCP servers unsandboxed with McpSessions(sandbox='none')"
                )
            return box.command(
                argv,
                workspace=workspace,
                limits=self.limits,
                read_only=[Path(p) for p in spec.read_only],
                env=spec.env,
            )

        return confined

    def open_sessions(self) -> list[SessionKey]:
        """Sessions holding connections now, least recently used first."""
        return list(self._sessions)

    # -- tools -----------------------------------------------------------------------------
    async def tools(
        self,
        servers: Sequence[McpServer],
        key: SessionKey,
        principal: Principal,
        workspace: Path | None,
        *,
        taken: Collection[str] = (),
    ) -> tuple[Tool, ...]:
        """The tools of ``servers`` for this session's turn, starting what is not running.

        A server that cannot start is offered as one ``<name>__unavailable`` tool whose
        description and result say why: the turn goes on without it. Names in ``taken`` (the
        agent's own tools) and repeated names are left out.
        """
        entry = self._entry(key)
        found: list[Tool] = []
        names = set(taken)
        entry.calls += 1
        try:
            for spec in servers:
                try:
                    offered = await self._tools_of(entry, spec, principal, workspace)
                except ToolError as exc:
                    log.warning("session %s: %s", key.session_id, exc)
                    offered = (_unavailable(spec, str(exc)),)
                except Exception as exc:  # a bug (a headers function's, say): not the turn's end
                    log.exception("session %s: MCP server %s failed", key.session_id, spec.name)
                    offered = (_unavailable(spec, f"{type(exc).__name__}: {exc}"),)
                for t in offered:
                    if t.name in names:
                        log.warning("MCP tool %s is left out: the name is taken", t.name)
                        continue
                    names.add(t.name)
                    found.append(t)
        finally:
            entry.calls -= 1
            self._touch(entry)
        return tuple(found)

    async def _tools_of(
        self, entry: _Session, spec: McpServer, principal: Principal, workspace: Path | None
    ) -> tuple[Tool, ...]:
        conn = await self._connection(entry, spec, principal, workspace)
        made = entry.tools.get(spec.name)
        if made is None:
            listed = await conn.list_tools()
            made = tuple(self._tool(spec, t) for t in listed)
            entry.tools[spec.name] = made
        return made

    def _tool(self, spec: McpServer, remote: types.Tool) -> Tool:
        name = f"{spec.name}__{_UNSAFE.sub('_', remote.name)}"[:64]
        about = (remote.description or remote.name).strip()

        async def call(arguments: dict[str, Any], ctx: ToolContext) -> str:
            return await self._call(spec, remote.name, arguments, ctx)

        parameters = remote.input_schema or _NO_ARGUMENTS
        return schema_tool(
            name,
            f"{about}\n(A tool of the MCP server {spec.name!r}.)",
            parameters,
            call,
            requires_approval=spec.requires_approval,
            timeout=spec.timeout,
        )

    async def _call(
        self, spec: McpServer, tool: str, arguments: dict[str, Any], ctx: ToolContext
    ) -> str:
        entry = self._entry(ctx.session)
        entry.calls += 1
        try:
            conn = await self._connection(entry, spec, ctx.principal, ctx.workspace)
            result = await conn.call(tool, arguments)
        finally:
            entry.calls -= 1
            self._touch(entry)
        from tether.tools.mcp.render import labelled, result_text

        text = labelled(spec.name, tool, result_text(result))
        if result.is_error:
            raise ToolError(f"the MCP tool {tool!r} of {spec.name!r} failed:\n{text}")
        return text

    async def _connection(
        self, entry: _Session, spec: McpServer, principal: Principal, workspace: Path | None
    ) -> Connection:
        """The session's live connection to ``spec``, opened (or opened again) if need be."""
        async with entry.lock:
            if entry.closed:
                raise ToolError(f"MCP server {spec.name!r}: the session was closed")
            conn = entry.connections.get(spec.name)
            same = conn is not None and conn.spec.describe() == spec.describe()
            if conn is not None and same and not conn.lost and conn.serves(principal):
                return conn
            if conn is not None:
                # Gone, another definition under the name, or another caller's credentials.
                del entry.connections[spec.name]
                entry.tools.pop(spec.name, None)
                await conn.close()
            from tether.tools.mcp.connection import Connection

            if isinstance(spec, McpStdio) and workspace is not None:
                ensure_workspace(workspace)
            wrap = self._wrap_for(spec) if isinstance(spec, McpStdio) else None
            conn = Connection(spec, workspace=workspace, principal=principal, wrap=wrap)
            await conn.open()
            log.info("MCP server %s connected for session %s", spec.name, entry.key.session_id)
            entry.connections[spec.name] = conn
            return conn

    # -- bookkeeping -----------------------------------------------------------------------
    def _entry(self, key: SessionKey) -> _Session:
        entry = self._sessions.get(key)
        if entry is None:
            entry = self._sessions[key] = _Session(key)
            self._evict_beyond_bound()
            if self._reaper is None or self._reaper.done():
                self._reaper = asyncio.create_task(self._reap(), name="tether-mcp-reaper")
        self._touch(entry)
        return entry

    def _touch(self, entry: _Session) -> None:
        entry.last_used = time.monotonic()
        if self._sessions.get(entry.key) is entry:
            self._sessions.move_to_end(entry.key)

    def _evict_beyond_bound(self) -> None:
        """Close the least recently used sessions making no call, down to the bound (the
        newest, just added, stays)."""
        excess = len(self._sessions) - self.max_sessions
        for key, entry in list(self._sessions.items())[:-1]:
            if excess <= 0:
                break
            if entry.calls == 0:
                log.info("closing the MCP servers of session %s (evicted)", key.session_id)
                self._close_later(self._sessions.pop(key))
                excess -= 1

    def _close_later(self, entry: _Session) -> None:
        task = asyncio.create_task(self._close_entry(entry), name="tether-mcp-close")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _reap(self) -> None:
        """Close sessions idle past ``idle_timeout``; ends when no session holds connections."""
        interval = max(0.05, min(self.idle_timeout / 4, 30.0))
        while self._sessions:
            await asyncio.sleep(interval)
            now = time.monotonic()
            idle = [
                key
                for key, e in self._sessions.items()
                if e.calls == 0 and now - e.last_used >= self.idle_timeout
            ]
            for key in idle:
                log.info("closing the MCP servers of session %s (idle)", key.session_id)
                self._close_later(self._sessions.pop(key))

    @staticmethod
    async def _close_entry(entry: _Session) -> None:
        async with entry.lock:
            entry.closed = True
            conns = list(entry.connections.values())
            entry.connections.clear()
            entry.tools.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # -- closing ---------------------------------------------------------------------------
    async def close_sessions(self, keys: Iterable[SessionKey]) -> None:
        """Close the servers of sessions that are gone (deleted, expired); their processes
        are stopped on return."""
        entries = [e for e in (self._sessions.pop(k, None) for k in keys) if e is not None]
        await asyncio.gather(*(self._close_entry(e) for e in entries))

    async def close_session(self, key: SessionKey) -> None:
        await self.close_sessions([key])

    async def close_owner(self, tenant: str, owner: str) -> None:
        """Close every session of one user (forgotten)."""
        await self.close_sessions(
            [k for k in self._sessions if k.tenant == tenant and k.owner == owner]
        )

    async def close(self) -> None:
        """Close every session's servers (the runtime is closing). The manager may be used
        again after: a later turn starts its servers anew."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None
        await self.close_sessions(list(self._sessions))
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def _unavailable(spec: McpServer, why: str) -> Tool:
    async def call(arguments: dict[str, Any], ctx: ToolContext) -> str:
        raise ToolError(why)

    return schema_tool(
        f"{spec.name}__unavailable",
        f"The tools of the MCP server {spec.name!r} are missing from this turn: {why}. "
        "Calling this tool only repeats the reason.",
        _NO_ARGUMENTS,
        call,
    )
