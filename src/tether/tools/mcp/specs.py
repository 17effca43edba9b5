"""What an agent says about the MCP servers whose tools it offers: frozen, part of its fingerprint.

A spec names a server; nothing runs until a session's turn needs the agent's tools (see
:class:`~tether.tools.mcp.sessions.McpSessions`). Each session gets its own connection to each
server: its own stdio process, its own HTTP client with its caller's headers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.errors import ConfigError
from tether.records import Principal

_SERVER_NAME = re.compile(r"^[a-zA-Z0-9-]{1,32}$")
"""No ``_``: the server's name and a tool's are joined by ``__`` into the name the model sees,
which must stay one of ``[a-zA-Z0-9_-]{1,64}``."""

DEFAULT_START_TIMEOUT = 30.0

Wrap = Callable[[list[str], Path], list[str]]
"""``(argv, workspace) -> argv`` that runs a stdio server's ``argv`` confined to the session's
``workspace`` (a sandbox's command for a long-lived process)."""


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _SERVER_NAME.match(name):
        raise ConfigError(f"MCP server name {name!r} must be 1-32 of [a-zA-Z0-9-]")


def _check_common(start_timeout: float, timeout: float | None) -> None:
    if not start_timeout > 0:
        raise ConfigError("MCP start_timeout must be a positive number of seconds")
    if timeout is not None and not timeout > 0:
        raise ConfigError("MCP tool timeout must be a positive number of seconds")


@dataclass(frozen=True, slots=True)
class McpStdio:
    """An MCP server run as a subprocess speaking over its stdin and stdout, one per session.

    It starts on the first turn of a session that needs the agent's tools, with the session's
    workspace as its working directory (inside the sandbox when the runtime has one), and is
    stopped with the session: deleted, expired, idle past the runtime's timeout, evicted, or
    the runtime closed.
    """

    name: str
    """Prefix of its tools' names (``files`` → ``files__read``): 1-32 of ``[a-zA-Z0-9-]``."""
    command: Sequence[str]
    """The program and its arguments (``["python", "server.py"]``); kept as a tuple."""
    env: Mapping[str, str] | None = None
    """Variables set over the few a server inherits (``HOME``, ``PATH``, ``USER`` …): the
    process's own environment is not passed on, so no secret of tether's reaches the server."""
    requires_approval: bool = False
    """Every call of its tools waits for a human decision."""
    timeout: float | None = None
    """Seconds a call of its tools may take (None: the agent's ``tool_timeout``)."""
    start_timeout: float = DEFAULT_START_TIMEOUT
    """Seconds it may take to start and answer the handshake; then the turn goes on without it
    (the model is told)."""
    read_only: Sequence[str] = ()
    """Host paths the server needs besides the system's ``/usr`` (its virtualenv, its script,
    a ``node_modules``): visible inside the sandbox at the same place, read-only. Nothing else
    of the host is (the data dir, other workspaces, ``/home``)."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        if isinstance(self.command, str) or not self.command:
            raise ConfigError(f"MCP server {self.name}: command must be a non-empty list")
        object.__setattr__(self, "command", tuple(str(c) for c in self.command))
        if isinstance(self.read_only, str):
            raise ConfigError(f"MCP server {self.name}: read_only must be a list of paths")
        object.__setattr__(self, "read_only", tuple(str(p) for p in self.read_only))
        if self.env is not None:
            object.__setattr__(self, "env", {str(k): str(v) for k, v in self.env.items()})
        _check_common(self.start_timeout, self.timeout)

    def describe(self) -> dict[str, Any]:
        """What the agent's fingerprint covers of it."""
        return {
            "kind": "stdio",
            "name": self.name,
            "command": list(self.command),
            "env": dict(sorted((self.env or {}).items())),
            "read_only": list(self.read_only),
            "requires_approval": self.requires_approval,
            "timeout": self.timeout,
        }


HeadersFor = Callable[[Principal], Mapping[str, str]]
"""The HTTP headers for a caller (an ``Authorization`` of their own, say)."""


def _callable_name(fn: object) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


@dataclass(frozen=True, slots=True)
class McpHttp:
    """An MCP server reached over Streamable HTTP; each session has its own client.

    ``headers`` is computed for the principal whose turn opens the session's connection, and
    that connection (its own HTTP client, its own MCP session) is never used for anyone else:
    a turn of another principal on the same session opens a fresh one with theirs.
    """

    name: str
    """Prefix of its tools' names (``search`` → ``search__query``): 1-32 of ``[a-zA-Z0-9-]``."""
    url: str
    """The server's MCP endpoint (``https://host/mcp``)."""
    headers: HeadersFor | None = field(default=None, compare=False)
    """Headers for the caller's requests, from their principal (None: no extra headers)."""
    requires_approval: bool = False
    """Every call of its tools waits for a human decision."""
    timeout: float | None = None
    """Seconds a call of its tools may take (None: the agent's ``tool_timeout``)."""
    start_timeout: float = DEFAULT_START_TIMEOUT
    """Seconds the connection and handshake may take; then the turn goes on without it."""

    def __post_init__(self) -> None:
        _check_name(self.name)
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"MCP server {self.name}: url must be http:// or https://")
        _check_common(self.start_timeout, self.timeout)

    def headers_for(self, principal: Principal) -> dict[str, str]:
        return dict(self.headers(principal)) if self.headers is not None else {}

    def describe(self) -> dict[str, Any]:
        """What the agent's fingerprint covers of it (the headers function by name)."""
        return {
            "kind": "http",
            "name": self.name,
            "url": self.url,
            "headers": _callable_name(self.headers) if self.headers is not None else None,
            "requires_approval": self.requires_approval,
            "timeout": self.timeout,
        }


McpServer = McpStdio | McpHttp
"""An MCP server an agent takes tools from."""
