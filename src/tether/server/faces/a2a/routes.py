"""The A2A face's HTTP routes: agent cards and one JSON-RPC endpoint per agent.

Not in ``/openapi.json``: A2A describes itself with its agent cards, and JSON-RPC answers every
error with HTTP 200 and an error object, which an OpenAPI document cannot tell apart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InternalError,
    InvalidRequestError,
    MethodNotFoundError,
    UnsupportedOperationError,
)
from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tether.agent import Agent
from tether.errors import AgentNotFound, InvalidInput, StoreError, TetherError, Unauthorized
from tether.records import Principal
from tether.server.conversation import agent_named
from tether.server.deps import State
from tether.server.faces.a2a import calls, streams, wire
from tether.server.faces.a2a.wire import Call, RpcError
from tether.server.problems import Problem
from tether.server.routes.turns import wait_for_turn
from tether.server.state import ServerState
from tether.version import __version__

router = APIRouter(tags=["a2a"], include_in_schema=False)

WELL_KNOWN = "/.well-known/agent-card.json"
SCHEME = "tether"
"""The card's name for its one security scheme: a tether API key as a bearer token."""


# -- cards -------------------------------------------------------------------------------------
@router.get(WELL_KNOWN)
async def default_card(request: Request, st: State) -> Response:
    """The card of the app's first agent (the one a bare A2A base URL means)."""
    if not st.agents:
        return _not_found("this server has no agents")
    return await _card(request, st, st.agents[0])


@router.get("/a2a/{agent}" + WELL_KNOWN)
async def agent_card(agent: str, request: Request, st: State) -> Response:
    try:
        found = agent_named(st, agent)
    except (AgentNotFound, InvalidInput):
        return _not_found(f"no agent {agent[:128]!r} here")
    return await _card(request, st, found)


async def _card(request: Request, st: ServerState, agent: Agent) -> Response:
    # A card is how a client learns how to authenticate, so it is public once keys exist; in
    # local mode it is served to whoever local mode serves (this machine, its own names).
    keys = await st.auth.keys_exist()
    if not keys:
        try:
            await st.auth.resolve(request, placeholder_keys=True)
        except (TetherError, Problem) as exc:
            refused = _auth_rpc_error(exc)
            return JSONResponse(
                {"error": refused.message}, status_code=refused.status, headers=refused.headers
            )
    return JSONResponse(agent_card_to_dict(card(request, agent, keys=keys)))


def card(request: Request, agent: Agent, *, keys: bool) -> pb.AgentCard:
    """``agent``'s card: its JSON-RPC endpoint in A2A 1.0 and 0.3, streaming, and (when the
    server has API keys) a bearer API key as the security scheme it requires."""
    base = str(request.base_url).rstrip("/")
    url = f"{base}/a2a/{quote(agent.name, safe='')}"
    description = agent.description or f"The tether agent {agent.name}."
    out = pb.AgentCard(
        name=agent.name,
        description=description,
        version=__version__,
        supported_interfaces=[
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            pb.AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3"),
        ],
        capabilities=pb.AgentCapabilities(
            streaming=True, push_notifications=False, extended_agent_card=False
        ),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain"],
        skills=[
            pb.AgentSkill(
                id=agent.name,
                name=agent.name,
                description=description,
                tags=["tether", *(t.name for t in agent.tools)],
            )
        ],
    )
    if keys:
        scheme = pb.HTTPAuthSecurityScheme(
            scheme="Bearer",
            description="A tether API key (made with `tether keys create`), or a JWT the "
            "server accepts, sent as Authorization: Bearer <key>.",
        )
        out.security_schemes[SCHEME].CopyFrom(pb.SecurityScheme(http_auth_security_scheme=scheme))
        out.security_requirements.append(pb.SecurityRequirement(schemes={SCHEME: pb.StringList()}))
    return out


def _not_found(detail: str) -> JSONResponse:
    return JSONResponse({"error": detail}, status_code=404)


# -- JSON-RPC ----------------------------------------------------------------------------------
@router.post("/a2a/{agent}")
async def rpc(agent: str, request: Request, st: State) -> Response:
    """A2A JSON-RPC for ``agent``: both spellings of SendMessage, SendStreamingMessage, GetTask,
    CancelTask and SubscribeToTask."""
    rid: wire.RequestId = None
    dialect: wire.Dialect = "1.0"
    try:
        body, rid = wire.envelope(await request.body())
        dialect = wire.dialect_of(body.get("method"))
        caller = await _caller(st, request)
        try:
            name = agent_named(st, agent).name
        except (AgentNotFound, InvalidInput):
            names = ", ".join(a.name for a in st.agents)
            raise _with_status(
                wire.error(MethodNotFoundError, f"no agent {agent[:128]!r} here (agents: {names})"),
                404,
            ) from None
        call = wire.parse(body, rid, request.headers.get(wire.VERSION_HEADER))
        return await _dispatch(st, request, caller, name, call)
    except RpcError as exc:
        return _error(exc, rid, dialect)
    except StoreError:
        return _error(wire.error(InternalError, "the store is not reachable"), rid, dialect)
    except TetherError as exc:
        return _error(wire.error(InternalError, str(exc)), rid, dialect)


async def _caller(st: ServerState, request: Request) -> Principal:
    """The same principal as every other door."""
    try:
        return await st.auth.resolve(request, placeholder_keys=True)
    except (TetherError, Problem) as exc:
        raise _auth_rpc_error(exc) from None


def _auth_rpc_error(exc: TetherError | Problem) -> RpcError:
    if isinstance(exc, Unauthorized):
        return RpcError(
            wire.UNAUTHENTICATED,
            str(exc),
            "UNAUTHENTICATED",
            domain=SCHEME,
            status=401,
            headers={"WWW-Authenticate": "Bearer"},
        )
    if isinstance(exc, Problem):
        refused = wire.error(InvalidRequestError, exc.detail)
        return _with_status(refused, exc.status, exc.headers)
    return _with_status(wire.error(InvalidRequestError, str(exc)), 400)


def _with_status(exc: RpcError, status: int, headers: dict[str, str] | None = None) -> RpcError:
    exc.status, exc.headers = status, headers
    return exc


def _error(exc: RpcError, rid: wire.RequestId, dialect: wire.Dialect) -> JSONResponse:
    return JSONResponse(
        wire.error_body(exc, rid, dialect), status_code=exc.status, headers=exc.headers
    )


async def _dispatch(
    st: ServerState, request: Request, caller: Principal, agent: str, call: Call
) -> Response:
    params = call.params
    if call.op == "stream" and isinstance(params, pb.SendMessageRequest):
        return await _stream(st, caller, agent, call, params)
    if call.op == "subscribe" and isinstance(params, pb.SubscribeToTaskRequest):
        return await _subscribe(st, caller, call, params)
    if call.op == "send" and isinstance(params, pb.SendMessageRequest):
        task = await _send(st, request, caller, agent, params)
        if task is None:
            return Response(status_code=499)  # the client left; the turn goes on
    elif call.op == "get" and isinstance(params, pb.GetTaskRequest):
        _, turn = await calls.locate(st, caller, params.id)
        task = await calls.snapshot(st, turn, calls.history_of(params))
    elif call.op == "cancel" and isinstance(params, pb.CancelTaskRequest):
        task = await calls.cancel(st, caller, params.id)
    else:  # parse() pairs each op with its params: this is a bug, said as A2A says one
        raise wire.error(InternalError, f"{call.method} was parsed into the wrong params")
    return JSONResponse(wire.result(call, task))


async def _send(
    st: ServerState, request: Request, caller: Principal, agent: str, params: pb.SendMessageRequest
) -> pb.Task | None:
    """The task once its turn ends or asks a human (``returnImmediately``: at once); None when
    the client went away first."""
    begun = await calls.begin(st, caller, agent, params)
    if begun.refused is not None:
        return begun.refused
    assert begun.turn is not None
    history = calls.history_of(params)
    if params.configuration.return_immediately:
        return await calls.snapshot(st, begun.turn, history)
    done = await wait_for_turn(st, request, begun.turn, "continue")
    return None if done is None else await calls.snapshot(st, done, history)


async def _stream(
    st: ServerState, caller: Principal, agent: str, call: Call, params: pb.SendMessageRequest
) -> Response:
    # Begun before the response starts: a refused request is a plain JSON-RPC error.
    begun = await calls.begin(st, caller, agent, params)

    async def items() -> AsyncIterator[pb.StreamResponse]:
        if begun.refused is not None:
            yield pb.StreamResponse(task=begun.refused)
            return
        assert begun.turn is not None
        # The task as it stood when the message was taken; the events from then on follow.
        yield pb.StreamResponse(task=await calls.snapshot(st, begun.turn))
        async for item in streams.follow(st, begun.turn, begun.after):
            yield item

    return _sse(call, items())


async def _subscribe(
    st: ServerState, caller: Principal, call: Call, params: pb.SubscribeToTaskRequest
) -> Response:
    key, _ = await calls.locate(st, caller, params.id)
    # The events' position first, then the turn: nothing after the snapshot is missed.
    after = await calls.last_seq(st, key, params.id.rpartition("/")[2])
    _, turn = await calls.locate(st, caller, params.id)
    if turn.ended:
        raise wire.error(
            UnsupportedOperationError,
            f"task {params.id[:300]!r} has ended ({turn.status}): read it with GetTask",
        )
    first = await calls.snapshot(st, turn)

    async def items() -> AsyncIterator[pb.StreamResponse]:
        yield pb.StreamResponse(task=first)
        if first.status.state == pb.TaskState.TASK_STATE_INPUT_REQUIRED:
            return  # nothing happens until someone answers it
        async for item in streams.follow(st, turn, after, joined=True):
            yield item

    return _sse(call, items())


def _sse(call: Call, items: AsyncIterator[pb.StreamResponse]) -> StreamingResponse:
    async def answers() -> AsyncIterator[dict[str, Any]]:
        try:
            async for item in items:
                yield wire.event(call, item)
        except RpcError as exc:
            yield wire.error_body(exc, call.id, call.dialect)
        except TetherError as exc:
            # The store failed mid-stream: say so in the stream, as JSON-RPC does.
            failed = wire.error(InternalError, f"the stream broke off: {type(exc).__name__}")
            yield wire.error_body(failed, call.id, call.dialect)

    return StreamingResponse(
        streams.frames(answers()),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
