"""``POST /api/chat``: PraisonAI AgentOS's chat contract, with real sessions behind it.

``{message, session_id?, agent_name?}`` → ``{response, agent_name, session_id}``. A supplied
session id continues (or mints) that session *in the caller's namespace* and is echoed verbatim;
an omitted, null or empty one starts a fresh session (as PraisonAI clients expect), and any other
invalid one is a 400: ids are never silently rewritten. Unlike the original, history persists,
turns on one session are serialized, and nobody reaches anybody else's session.

A turn that waits for a human (a tool approval, ``ask_user``: DESIGN §7) answers 202 with
``{status: "awaiting_input", turn_id, session_id, agent_name, decisions}``, which PraisonAI's
contract has no word for (``status: "queued"`` and ``behind`` when it waits behind an earlier
turn of the session that asks, whose decisions are then listed); decide through
``POST /v1/sessions/{sid}/turns/{tid}/decisions`` and follow the turn (``GET …/turns/{tid}``
or its ``/events``) to its reply.
"""

from __future__ import annotations

import time
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.responses import JSONResponse, Response

from tether.records import Principal, Turn
from tether.server.conversation import run_turn
from tether.server.deps import Caller, State
from tether.server.problems import responses
from tether.server.routes.outcomes import turn_problem
from tether.server.routes.turns import IdempotencyHeader
from tether.server.schemas import (
    AgentMetadata,
    AgentReply,
    AgentRequest,
    ChatRequest,
    ChatResponse,
    DecisionOut,
)
from tether.server.state import ServerState

router = APIRouter(tags=["compatibility"])


class ChatAwaitingInput(BaseModel):
    """The turn waits for a human: decide it, then follow the turn to its reply."""

    status: Literal["awaiting_input", "queued"] = Field(
        "awaiting_input",
        description="awaiting_input: the turn itself asks; queued: it waits behind a turn of "
        "the session that asks (behind).",
    )
    turn_id: str
    session_id: str
    agent_name: str
    decisions: list[DecisionOut] = Field(
        ...,
        description="What the turn waits for: decide each with POST "
        "/v1/sessions/{session_id}/turns/{decision.turn_id}/decisions.",
    )
    behind: str | None = Field(None, description="The turn awaiting input it waits behind.")


_CHAT_RESPONSES = {
    202: {
        "description": "the turn waits for a decision (a tool approval, a question)",
        "model": ChatAwaitingInput,
    },
    **responses(
        429,
        502,
        e400="malformed JSON, an invalid session id, or a server with no agents",
        e404="no such agent",
        e409="the turn was cancelled or interrupted",
        e413="the body or message is over its size bound",
        e422="the body does not match the schema, or the turn hit a limit",
        e500="the turn failed inside the server",
        e503="the store is unreachable, or the server running the turn stopped",
    ),
}


@router.post("/api/chat", response_model=ChatResponse, responses=_CHAT_RESPONSES)
async def chat(
    body: ChatRequest,
    request: Request,
    st: State,
    caller: Caller,
    idempotency_key: IdempotencyHeader = None,
) -> Response:
    """Send a message and get the agent's reply; 202 when the turn waits for a human decision
    (decide it through ``/v1/sessions/{sid}/turns/{tid}/decisions``). A retry with the same
    ``Idempotency-Key`` on the same session gets the turn the first one made."""
    done = await _turn(
        st, request, caller, body.message, body.session_id, body.agent_name, idempotency_key
    )
    if not isinstance(done, Turn):
        return done
    if not done.ended:
        return await _awaiting_input(st, done)
    out = ChatResponse(
        response=done.output or "",
        agent_name=done.agent_name,
        session_id=done.key.session_id,
        turn_id=done.id,
        complete=None if done.complete else False,
    )
    # PraisonAI's contract, and tether's turn id; a cut reply says so (the contract cannot).
    return JSONResponse(out.model_dump(exclude={"complete"} if done.complete else None))


@router.post("/agent", response_model=AgentReply, responses=_CHAT_RESPONSES)
async def agent(
    body: AgentRequest,
    request: Request,
    st: State,
    caller: Caller,
    idempotency_key: IdempotencyHeader = None,
) -> Response:
    """The remote-agent contract: ``{message, session_id?}`` → ``{content, session_id,
    metadata: {agent_name, timestamp, turn_id, status}}``, with the server's first agent."""
    return await _agent_reply(st, request, caller, body, None, idempotency_key)


@router.post("/agents/{name}", response_model=AgentReply, responses=_CHAT_RESPONSES)
async def named_agent(
    name: str,
    body: AgentRequest,
    request: Request,
    st: State,
    caller: Caller,
    idempotency_key: IdempotencyHeader = None,
) -> Response:
    """``POST /agent`` for the agent named ``name`` (a server that serves several)."""
    return await _agent_reply(st, request, caller, body, name, idempotency_key)


async def _agent_reply(
    st: ServerState,
    request: Request,
    caller: Principal,
    body: AgentRequest,
    name: str | None,
    idempotency_key: str | None,
) -> Response:
    done = await _turn(st, request, caller, body.message, body.session_id, name, idempotency_key)
    if not isinstance(done, Turn):
        return done
    if not done.ended:
        waiting = await _waiting(st, done)
        metadata = AgentMetadata(
            agent_name=waiting.agent_name,
            timestamp=time.time(),
            turn_id=done.id,
            status=waiting.status,
            decisions=waiting.decisions,
            behind=waiting.behind,
        )
        reply = AgentReply(content="", session_id=done.key.session_id, metadata=metadata)
        return JSONResponse(
            reply.model_dump(mode="json", exclude={"metadata": {"complete"}}),
            status_code=202,
            headers={"Location": _at(done)},
        )
    metadata = AgentMetadata(
        agent_name=done.agent_name,
        timestamp=done.ended_at or time.time(),
        turn_id=done.id,
        status=done.status,
        behind=None,
        complete=None if done.complete else False,
    )
    out = AgentReply(content=done.output or "", session_id=done.key.session_id, metadata=metadata)
    # The contract's four metadata keys: what a waiting turn adds is not there when it ended,
    # and a cut reply says so.
    hidden = {"decisions", "behind"} | (set() if not done.complete else {"complete"})
    return JSONResponse(out.model_dump(exclude={"metadata": hidden}))


async def _turn(
    st: ServerState,
    request: Request,
    caller: Principal,
    message: str,
    session_id: str | None,
    agent_name: str | None,
    idempotency_key: str | None,
) -> Turn | Response:
    """Run one turn on the caller's session (made if need be): the completed turn, or the
    response to give instead (499 gone, 202 waiting for a human, a problem)."""
    # A session may be served by several of the app's agents: the turn names its own, and one
    # that names none runs the session's own agent (the app's first for a new session).
    sent, done = await run_turn(
        st, request, caller, message, session_id, agent_name, idempotency_key=idempotency_key
    )
    if done is None:
        return Response(status_code=499)
    if not done.ended:
        return done  # waiting for a human: each route answers 202 in its own shape
    if done.status != "completed":
        asked = sent.agent.name if sent.agent is not None else done.agent_name
        return turn_problem(done, agent_name=asked, session_id=sent.key.session_id)
    return done


async def _waiting(st: ServerState, turn: Turn) -> ChatAwaitingInput:
    """What a turn waiting for a human waits for, and which agent asks."""
    scheduler = st.runtime.scheduler
    ahead = await scheduler.parked_ahead(turn)
    waits_on = ahead.id if ahead is not None else turn.id
    pending = await scheduler.decisions(turn.key, turn_id=waits_on, status="pending")
    # The agent that asks is the one running when the turn parked (after any handoff).
    asking = next((d.payload.get("agent") for d in pending if d.payload.get("agent")), None)
    return ChatAwaitingInput(
        status="queued" if ahead is not None else "awaiting_input",
        turn_id=turn.id,
        session_id=turn.key.session_id,
        agent_name=str(asking or turn.agent_name),
        decisions=[DecisionOut.of(d) for d in pending],
        behind=ahead.id if ahead is not None else None,
    )


def _at(turn: Turn) -> str:
    return f"/v1/sessions/{turn.key.session_id}/turns/{turn.id}"


async def _awaiting_input(st: ServerState, turn: Turn) -> JSONResponse:
    out = await _waiting(st, turn)
    return JSONResponse(
        out.model_dump(mode="json"), status_code=202, headers={"Location": _at(turn)}
    )
