"""The MCP face: each of the app's agents is a tool of an MCP server at ``/mcp``.

Streamable HTTP, stateless (no ``Mcp-Session-Id``): every request carries all it needs, so any
server process answers any request, for the handshake era (``initialize``, 2024-11-05 …
2025-11-25) and the 2026-07-28 per-request era alike.

A tool is named after its agent and takes ``{message, session_id?}``. Without ``session_id`` (or
with an empty one) the call starts a new conversation: a fresh session in the caller's
namespace. The result names the session twice, in ``structuredContent`` ``{reply, session_id,
turn_id, status, complete}`` and in a second text block (hosts often show the model the text
only), so the host passes ``session_id`` back to continue. A ``session_id`` the caller does not
have (unknown, expired, or another principal's) is a tool error (``isError: true``, code
``session_not_found``), never a silent fresh chat.

Only a completed turn is a plain result. Every other ending is ``isError: true`` with a sentence
saying what happened and ``structuredContent`` ``{code, message, status, reason, session_id,
turn_id}``: ``failed`` (``model_error`` when the provider failed), ``cancelled``,
``interrupted``, ``limit_reached``…; a turn waiting for a human decision is code
``awaiting_input`` with its pending ``decisions`` and how to decide them through tether's API
(``POST /v1/sessions/{sid}/turns/{tid}/decisions``, then follow the turn). A message to a
session whose earlier turn waits so is withdrawn rather than left queued behind it (code
``awaiting_input``, status ``cancelled``, ``behind`` that turn): a tool error means nothing was
done, and a host that calls again must not pile up turns. Refusals before a turn (a full
queue, a message over its bound) are tool errors with tether's reason code too.
Protocol faults stay MCP errors: an unknown tool is ``-32602``, an internal fault ``-32603``
(with no detail).

Cancellation: a host that cancels the call cancels the turn (reason ``caller_cancelled``). At
2026-07-28 the host cancels by closing the request's response stream; in the handshake era by
posting ``notifications/cancelled``, which this face applies itself (the SDK's stateless
transport has no state to apply it with): it cancels the caller's own call of that request id
on this process, and nothing when it is ambiguous (two of the caller's calls share the id). A
handshake-era client that merely disconnects does not cancel (the spec says a disconnect is not
a cancel): the turn goes on and stays readable through tether's API.

A call's response stream is pinged while the turn runs (:data:`tether.server.sse.PING_SECONDS`),
so a client's read timeout does not end a call whose model thinks long.

Authentication is the same principal as every door: ``Authorization: Bearer`` or ``X-API-Key``
on each HTTP request, resolved before the SDK sees the request; refused requests get a JSON-RPC
error body with the HTTP status (401 with ``WWW-Authenticate: Bearer``). ``TETHER_FACES_MCP=off``
switches the face off.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from fastapi import FastAPI
from mcp.server import Server, ServerRequestContext
from mcp.server import _streamable_http_modern as modern_http
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tether.errors import SessionNotFound, TetherError
from tether.records import SESSION_ID_PATTERN, Principal, SessionKey, Turn
from tether.server import sse
from tether.server.conversation import send
from tether.server.faces.endings import ended_code, ended_message, refusal, waiting
from tether.server.problems import Problem
from tether.server.state import ServerState
from tether.version import __version__

log = logging.getLogger(__name__)

PATH = "/mcp"
_PRINCIPAL = "tether.principal"
"""The ASGI scope key the caller rides on from the HTTP request to the tool call."""

INPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What you say to the agent."},
        "session_id": {
            "type": "string",
            "maxLength": 128,
            "description": "The conversation to continue: the session_id an earlier call of "
            "this server returned. Omit it to start a new conversation.",
        },
    },
    "required": ["message"],
}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reply": {"type": "string", "description": "The agent's answer."},
        "session_id": {"type": "string", "description": "Pass it back to continue."},
        "turn_id": {"type": "string"},
        "status": {"type": "string", "description": "completed"},
        "complete": {
            "type": "boolean",
            "description": "False when the reply was cut at the output limit.",
        },
    },
    "required": ["reply", "session_id", "turn_id", "status"],
}


class McpFace:
    """The MCP server of one app: an ASGI endpoint for ``/mcp`` and the lifespan it needs."""

    def __init__(self, st: ServerState) -> None:
        self.st = st
        self.server: Server[Any] = Server(
            "tether",
            version=__version__,
            instructions="Each tool is an agent. Call it with a message; to continue a "
            "conversation, pass the session_id its last result gave.",
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        # Stateless: no session lives in one process's memory (DESIGN §4: any process serves
        # any request). tether's own BodyLimit bounds bodies before they get here.
        self.manager = StreamableHTTPSessionManager(
            self.server, stateless=True, max_request_body_size=st.settings.limits.max_body_bytes
        )
        self.calls = _Calls()
        self._closing = False
        # At 2026-07-28 the SDK holds a call's response back (no headers) for up to this long,
        # then answers with an event stream pinged as often. Its 15 s outlast httpx's default
        # read timeout (5 s), the very client its examples use: a call on a model that thinks
        # longer failed, and its closed stream cancelled the turn. (Handshake-era streams get
        # tether's pings below.) A private name of the pinned SDK: tests/server/
        # test_faces_keepalive.py fails if it stops meaning this.
        modern_http._SSE_PING_INTERVAL = sse.PING_SECONDS

    def install(self, app: FastAPI) -> None:
        # A plain route to an ASGI app (this object: Starlette would take a bound method for a
        # request handler): JSON-RPC has no place in the OpenAPI document, and a Mount would
        # answer the bare /mcp with a redirect.
        app.router.routes.append(Route(PATH, self, methods=["GET", "POST", "DELETE"]))

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's task group, for the app's lifespan."""
        async with self.manager.run():
            try:
                yield
            finally:
                # Calls the shutdown cancels are not the host's cancels: their turns go on
                # (or drain) as the runtime decides.
                self._closing = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = await self.st.auth.resolve(request, placeholder_keys=True)
        except (TetherError, Problem) as exc:
            await _refuse(exc, send)
            return
        if scope["method"] == "POST":
            body, receive = await _buffered(receive)
            self._apply_cancel(caller, body)
        # The SDK sends a call's response stream nothing until the turn has ended: pinged, a
        # client's read timeout (httpx's is 5 s) does not end the call (and cancel the turn)
        # while the model thinks.
        alive = sse.KeepAlive(send)
        scope = {**scope, _PRINCIPAL: caller}
        async with anyio.create_task_group() as pings:
            pings.start_soon(alive.pinging)
            try:
                await self.manager.handle_request(scope, receive, alive.send)
            finally:
                pings.cancel_scope.cancel()

    def _apply_cancel(self, caller: Principal, body: bytes) -> None:
        """A handshake-era ``notifications/cancelled``: cancel the caller's call it names."""
        if b"notifications/cancelled" not in body:
            return
        try:
            message = json.loads(body)
        except ValueError:
            return  # the SDK answers the malformed body
        if not isinstance(message, dict) or message.get("method") != "notifications/cancelled":
            return
        params = message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(request_id, str | int):
            turn = self.calls.only(caller, request_id)
            if turn is not None:
                self.st.spawn(self.st.runtime.scheduler.cancel(*turn, "caller_cancelled"))

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [
            types.Tool(
                name=agent.name,
                title=agent.name,
                description=agent.description or f"Talk to the agent {agent.name}.",
                input_schema=INPUT_SCHEMA,
                output_schema=OUTPUT_SCHEMA,
            )
            for agent in self.st.agents
        ]
        return types.ListToolsResult(tools=tools)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in {a.name for a in self.st.agents}:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {params.name}")
        caller = _caller(ctx)
        try:
            return await self._converse(ctx, caller, params)
        except (TetherError, Problem, _BadArguments) as exc:
            return _refusal(exc)
        except Exception:
            # The handshake-era dispatcher would put the exception's text on the wire.
            log.exception("the MCP tool call failed")
            raise MCPError(types.INTERNAL_ERROR, "internal error") from None

    async def _converse(
        self, ctx: ServerRequestContext[Any], caller: Principal, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        message, session_id = _arguments(params.arguments)
        try:
            # Shielded: a cancel that lands mid-submission must still learn the turn to cancel.
            with anyio.CancelScope(shield=True):
                turn = await send(self.st, caller, session_id, message, params.name, create=False)
        except SessionNotFound:
            text = f"no session {session_id!r}: omit session_id to start a new conversation"
            return _error("session_not_found", text)
        with self.calls.track(caller, ctx.request_id, turn):
            try:
                done = await self.st.runtime.scheduler.wait(turn.key, turn.id, until_input=True)
            except anyio.get_cancelled_exc_class():
                # At 2026-07-28 a closed response stream is the host's cancel; before it, only
                # notifications/cancelled is (see _apply_cancel), and a disconnect is not.
                if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS and not self._closing:
                    scheduler = self.st.runtime.scheduler
                    self.st.spawn(scheduler.cancel(turn.key, turn.id, "caller_cancelled"))
                raise
        return await self._outcome(done)

    async def _outcome(self, turn: Turn) -> types.CallToolResult:
        sid = turn.key.session_id
        if not turn.ended:
            # Queued behind a turn that waits for a human, the turn is withdrawn: a tool error
            # must mean that nothing was done, for a host (or its model) calls again, and each
            # call would queue one more turn, all to run once the decision is made.
            withdrawn = turn.status == "queued"
            wait = await waiting(self.st, turn, withdrawn=withdrawn)
            if withdrawn:
                scheduler = self.st.runtime.scheduler
                turn = await scheduler.cancel(turn.key, turn.id, "caller_cancelled")
            return _error(
                "awaiting_input",
                wait.message,
                session_id=sid,
                turn_id=turn.id,
                status=turn.status,
                decisions=wait.decisions,
                behind=wait.behind,
            )
        about = {"session_id": sid, "turn_id": turn.id, "status": turn.status}
        if turn.status != "completed":
            return _error(ended_code(turn), ended_message(turn), **about, reason=turn.reason)
        reply = turn.output or ""
        return types.CallToolResult(
            content=[types.TextContent(text=reply), _session_note(sid)],
            structured_content={"reply": reply, **about, "complete": turn.complete},
        )


@dataclass(frozen=True)
class _Call:
    key: SessionKey
    turn_id: str


class _Calls:
    """The tool calls this process is running, by caller and JSON-RPC request id: what a
    handshake-era ``notifications/cancelled`` may name."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, str, str | int], list[_Call]] = {}

    @contextmanager
    def track(self, caller: Principal, request_id: str | int | None, turn: Turn) -> Iterator[None]:
        if request_id is None:
            yield
            return
        slot = (caller.tenant, caller.user, request_id)
        call = _Call(turn.key, turn.id)
        self._running.setdefault(slot, []).append(call)
        try:
            yield
        finally:
            calls = self._running[slot]
            calls.remove(call)
            if not calls:
                del self._running[slot]

    def only(self, caller: Principal, request_id: str | int) -> tuple[SessionKey, str] | None:
        """The caller's one running call with this id; None for none, or for two (request ids
        are only unique per client connection, and guessing could cancel the wrong turn)."""
        calls = self._running.get((caller.tenant, caller.user, request_id), [])
        if len(calls) != 1:
            if calls:
                log.warning("notifications/cancelled names %d calls; cancelling none", len(calls))
            return None
        return calls[0].key, calls[0].turn_id


def _caller(ctx: ServerRequestContext[Any]) -> Principal:
    request = ctx.request
    caller = request.scope.get(_PRINCIPAL) if isinstance(request, Request) else None
    if not isinstance(caller, Principal):
        raise RuntimeError("an MCP request reached a tool without a resolved principal")
    return caller


class _BadArguments(Exception):
    """Arguments outside the tool's input schema (a tool error the model can correct)."""


def _arguments(arguments: dict[str, Any] | None) -> tuple[str, str | None]:
    args = arguments or {}
    message = args.get("message")
    if not isinstance(message, str):
        raise _BadArguments("message must be a string: what you say to the agent")
    session_id = args.get("session_id")
    if session_id is None or session_id == "":
        return message, None
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id):
        raise _BadArguments(
            "session_id must be a session id an earlier call returned "
            "(1-128 characters of letters, digits and '._:-'); omit it to start a conversation"
        )
    return message, session_id


def _session_note(session_id: str) -> types.TextContent:
    return types.TextContent(
        text=f"session_id: {session_id} (pass it as session_id to continue this conversation)"
    )


def _error(code: str, message: str, **about: Any) -> types.CallToolResult:
    content: list[types.ContentBlock] = [types.TextContent(text=message)]
    if "session_id" in about:
        content.append(_session_note(about["session_id"]))
    return types.CallToolResult(
        content=content,
        structured_content={"code": code, "message": message, **about},
        is_error=True,
    )


def _refusal(exc: TetherError | Problem | _BadArguments) -> types.CallToolResult:
    if isinstance(exc, _BadArguments):
        return _error("invalid_arguments", str(exc))
    said = refusal(exc)
    return _error(said.code, said.message)


async def _refuse(exc: TetherError | Problem, send: Send) -> None:
    """An HTTP refusal before the SDK: the status, with a JSON-RPC error the client reads."""
    said = refusal(exc)
    error = {"code": types.INVALID_REQUEST, "message": said.message}
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in said.headers.items()]
    await send({"type": "http.response.start", "status": said.status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request's whole body, and a ``receive`` that replays it before going on."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            # Gone before the body arrived: hand the SDK what came.
            return b"".join(chunks), _replay(b"".join(chunks), receive, message)
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), _replay(b"".join(chunks), receive, None)


def _replay(body: bytes, receive: Receive, last: Message | None) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if last is not None:
        pending.append(last)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
