"""``POST /api/chat``: PraisonAI AgentOS's chat contract, with real sessions behind it.

``{message, session_id?, agent_name?}`` → ``{response, agent_name, session_id}``. A supplied
session id continues (or mints) that session *in the caller's namespace* and is echoed verbatim;
an omitted, null or empty one starts a fresh session (as PraisonAI clients expect), and any other
invalid one is a 400: ids are never silently rewritten. Unlike the original, history persists,
turns on one session are serialized, and nobody reaches anybody else's session.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from tether.errors import Conflict, InvalidInput
from tether.records import SessionKey, new_session_id
from tether.server.deps import Caller, State, check_message, unknown_agent
from tether.server.problems import responses
from tether.server.routes.outcomes import turn_problem
from tether.server.routes.turns import wait_for_turn
from tether.server.schemas import ChatRequest, ChatResponse

router = APIRouter(tags=["compatibility"])


@router.post(
    "/api/chat",
    response_model=ChatResponse,
    responses=responses(
        429,
        502,
        e400="malformed JSON, an invalid session id, or a server with no agents",
        e404="no such agent",
        e409="the session belongs to another agent, or the turn was cancelled or interrupted",
        e413="the body or message is over its size bound",
        e422="the body does not match the schema, or the turn hit a limit",
        e500="the turn failed inside the server",
        e503="the store is unreachable, or the server running the turn stopped",
    ),
)
async def chat(body: ChatRequest, request: Request, st: State, caller: Caller) -> Response:
    """Send a message and get the agent's reply."""
    if not st.agents:
        raise InvalidInput("this server has no agents")
    agent_name = body.agent_name or st.agents[0].name
    if agent_name not in st.runtime.agents:
        raise unknown_agent(st, agent_name)
    check_message(st, body.message)
    session_id = body.session_id or new_session_id()
    key = SessionKey.of(caller, session_id)
    record, _ = await st.runtime.sessions.create(
        key, agent_name, exist_ok=True, replace_expired=True
    )
    if record.agent != agent_name:
        raise Conflict(f"session {session_id!r} belongs to agent {record.agent!r}")
    turn = await st.runtime.scheduler.submit(
        key, body.message, principal=caller, wait_for_slot=st.settings.admission_wait
    )
    done = await wait_for_turn(st, request, turn, "continue")
    if done is None:
        return Response(status_code=499)
    if done.status != "completed":
        return turn_problem(done, agent_name=agent_name, session_id=session_id)
    out = ChatResponse(response=done.output or "", agent_name=agent_name, session_id=session_id)
    return JSONResponse(out.model_dump())
