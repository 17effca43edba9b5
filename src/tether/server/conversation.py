"""What every door does with one message: find the agent, open the caller's session, submit.

``/api/chat``, ``POST /agent`` and each protocol face (DESIGN §9) map their own words onto
these steps, so a message behaves alike whichever door it comes through: the same principal,
the same namespace, the same size checks, the same scheduler. Only the answer's shape differs,
and that is each door's own business.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from starlette.requests import Request

from tether.agent import Agent
from tether.errors import InvalidInput, SessionNotFound
from tether.records import (
    AgentRef,
    Policy,
    Principal,
    SessionKey,
    SessionRecord,
    Turn,
    new_session_id,
)
from tether.server.deps import check_message
from tether.server.routes.turns import wait_for_turn
from tether.server.state import ServerState


@dataclass(frozen=True)
class Opened:
    """The caller's session and the agent a turn on it runs."""

    key: SessionKey
    record: SessionRecord
    agent: Agent
    created: bool


def agent_named(st: ServerState, name: str) -> Agent:
    """The served agent ``name`` (AgentNotFound names the ones that are)."""
    if not st.agents:
        raise InvalidInput("this server has no agents")
    return st.runtime.served(name)


async def open_session(
    st: ServerState,
    caller: Principal,
    session_id: str | None,
    agent_name: str | None = None,
    *,
    create: bool = True,
    message: str | None = None,
    idle_ttl: float | None = None,
) -> Opened:
    """The caller's session ``session_id`` (None: a fresh one) and the agent to run.

    ``create``: a session that is not there is made (an expired one starts afresh); without
    it, an unknown, foreign or expired id is SessionNotFound, like every other door's 404.
    ``message`` is checked (size, NUL) before anything is stored. ``idle_ttl``: seconds a
    session made here is kept after its latest activity. A turn that names no agent runs the
    session's own agent (the app's first one for a new session).
    """
    if not st.agents:
        raise InvalidInput("this server has no agents")
    named = st.runtime.served(agent_name) if agent_name else None
    if message is not None:
        check_message(st, message)
    key = SessionKey.of(caller, session_id or new_session_id())
    if create or session_id is None:
        first = named.name if named is not None else st.agents[0].name
        record, created = await st.runtime.sessions.create(
            key,
            first,
            exist_ok=True,
            replace_expired=True,
            ttl_seconds=idle_ttl,
            idle=idle_ttl is not None,
        )
    else:
        record, created = await st.runtime.sessions.own(key), False
    if named is not None:
        agent = named
    else:
        agent = st.runtime.agents.get(record.agent) or st.runtime.served(st.agents[0].name)
    return Opened(key, record, agent, created)


async def submit(
    st: ServerState,
    opened: Opened,
    caller: Principal,
    message: str,
    *,
    policy: Policy = "enqueue",
    idempotency_key: str | None = None,
) -> Turn:
    """Queue ``message`` as a turn of the opened session's agent."""
    check_message(st, message)
    return await st.runtime.scheduler.submit(
        opened.key,
        message,
        policy=policy,
        principal=caller,
        wait_for_slot=st.settings.admission_wait,
        agent=opened.agent.ref,
        idempotency_key=idempotency_key,
    )


async def send(
    st: ServerState,
    caller: Principal,
    session_id: str | None,
    message: str,
    agent_name: str | None = None,
    *,
    create: bool = True,
    policy: Policy = "enqueue",
    idle_ttl: float | None = None,
    idempotency_key: str | None = None,
) -> Turn:
    """Queue ``message`` on the caller's session ``session_id``: :func:`open_session` then
    :func:`submit`, with the same outcomes, in fewer store calls.

    A session that is there (a conversation's next message, the common case) is not read or
    written first: the admission finds it, and the scheduler learns the session's agent as the
    native turn route has it do. Only when the admission finds no session (unknown, or
    expired) is it made, with ``create``, and the message sent again.
    """
    if not st.agents:
        raise InvalidInput("this server has no agents")
    named = st.runtime.served(agent_name) if agent_name else None
    check_message(st, message)
    if not session_id:  # None or "": a fresh session, as open_session makes
        opened = await open_session(st, caller, None, agent_name, idle_ttl=idle_ttl)
        return await submit(
            st, opened, caller, message, policy=policy, idempotency_key=idempotency_key
        )
    key = SessionKey.of(caller, session_id)
    first = st.agents[0].name

    def own_agent(name: str) -> AgentRef:
        # As open_session: the session's agent, or the app's first when it serves no such one.
        return (st.runtime.agents.get(name) or st.runtime.served(first)).ref

    async def attempt() -> Turn:
        return await st.runtime.scheduler.submit(
            key,
            message,
            policy=policy,
            principal=caller,
            wait_for_slot=st.settings.admission_wait,
            agent=named.ref if named is not None else None,
            own_agent=own_agent,
            idempotency_key=idempotency_key,
        )

    try:
        return await attempt()
    except SessionNotFound:
        if not create:
            raise
    await st.runtime.sessions.create(
        key,
        named.name if named is not None else first,
        exist_ok=True,
        replace_expired=True,
        ttl_seconds=idle_ttl,
        idle=idle_ttl is not None,
    )
    return await attempt()


async def run_turn(
    st: ServerState,
    request: Request,
    caller: Principal,
    message: str,
    session_id: str | None,
    agent_name: str | None = None,
    *,
    create: bool = True,
    policy: Policy = "enqueue",
    idempotency_key: str | None = None,
) -> tuple[Turn, Turn | None]:
    """Send and wait: the turn as accepted, and as it ended or waits for a human decision
    (None when the client went away first: a request's end is not a cancel, the turn goes
    on)."""
    turn = await send(
        st,
        caller,
        session_id,
        message,
        agent_name,
        create=create,
        policy=policy,
        idempotency_key=idempotency_key,
    )
    return turn, await wait_for_turn(st, request, turn, "continue")


def as_taken(turn: Turn, asked_at: float) -> Turn:
    """``turn`` as the request that made it took it: a turn made by that request (created
    after ``asked_at``) and started in the same write that admitted it is shown queued, as an
    accepted request is answered (A2A's submitted task, OpenAI's queued background response);
    its start follows in its events. A retry's turn, made earlier, is shown as it stands."""
    if turn.status == "running" and turn.created_at >= asked_at:
        return replace(turn, status="queued", started_at=None)
    return turn
