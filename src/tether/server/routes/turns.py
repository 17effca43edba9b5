"""Turns: submit (wait, stream or fire-and-forget), list, follow, cancel, decide."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tether.errors import Conflict, SessionNotFound, TurnNotFound
from tether.events import TURN_ENDED
from tether.records import AgentRef, Decision, Event, SessionKey, Turn
from tether.server import sse
from tether.server.deps import (
    Asking,
    AskingSession,
    Caller,
    Key,
    OwnSession,
    State,
    check_message,
)
from tether.server.routes.outcomes import turn_response
from tether.server.schemas import (
    IDEMPOTENCY_KEY,
    DecisionIn,
    DecisionList,
    DecisionOut,
    TurnCreate,
    TurnOut,
    TurnPage,
    minted,
)
from tether.server.state import ServerState

log = logging.getLogger("tether.server")
router = APIRouter(prefix="/v1/sessions/{sid}/turns", tags=["turns"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "unknown or not yours (indistinguishable)"}
}
SSE: dict[str, Any] = {"text/event-stream": {"schema": {"type": "string"}}}


async def wait_for_turn(
    st: ServerState, request: Request, turn: Turn, on_disconnect: str
) -> Turn | None:
    """Wait for the turn's end, or for it to wait for a decision (the caller is the one to
    make it); None if the client went away first (after applying the policy)."""
    waiter = asyncio.ensure_future(st.runtime.scheduler.wait(turn.key, turn.id, until_input=True))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiter.done():
        return waiter.result()
    waiter.cancel()
    if on_disconnect == "cancel":
        st.spawn(st.runtime.scheduler.cancel(turn.key, turn.id, "client_disconnected"))
    return None


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_ENDED_FRAME = f"event: {TURN_ENDED}".encode()


def event_stream(
    st: ServerState, key: SessionKey, turn_id: str, after: int, on_disconnect: str
) -> StreamingResponse:
    async def frames() -> AsyncIterator[bytes]:
        finished = False
        try:
            try:
                async for chunk in sse.stream(_until_end(st, key, turn_id, after)):
                    finished = finished or (chunk.startswith(b"id:") and _ENDED_FRAME in chunk)
                    yield chunk
            except (TurnNotFound, SessionNotFound):
                # The session was deleted (its turns ended first) before this stream read the
                # ending: the stream ends, cleanly; a client that comes back gets the 404.
                log.info("turn %s: its session is gone; the stream ends", turn_id)
            # Ended by us, not by the client: the turn is over, or this process is shutting
            # down with the turn still queued (the client re-attaches; nobody left).
            finished = True
        finally:
            if not finished and on_disconnect == "cancel":
                st.spawn(st.runtime.scheduler.cancel(key, turn_id, "client_disconnected"))

    return StreamingResponse(
        frames(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _until_end(
    st: ServerState, key: SessionKey, turn_id: str, after: int
) -> AsyncIterator[Event]:
    async for event in st.runtime.scheduler.events(key, turn_id, after_seq=after):
        yield event


IdempotencyHeader = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retries with this key (same session, same request, within a day) get the "
        "turn the first one made; the key with another request is a 422.",
        min_length=1,
        max_length=255,
        pattern=IDEMPOTENCY_KEY,
    ),
]


@router.post(
    "",
    responses={
        200: {"description": "the completed turn (wait=true)", "content": SSE},
        202: {
            "description": "accepted (wait=false): queued, or started already; or (wait=true) "
            "waiting for a human decision: "
            "status awaiting_input with its decisions, or queued behind a turn awaiting input "
            "(behind) with that turn's decisions",
            "model": TurnOut,
        },
        409: {"description": "policy=reject and the session is busy; or the turn was cancelled"},
        413: {"description": "message too large"},
        422: {"description": "invalid body, an idempotency key reused, or the turn hit a limit"},
        429: {"description": "the session's queue is full"},
        502: {"description": "the model provider failed"},
        **NOT_FOUND,
    },
    response_model=TurnOut,
)
async def create_turn(
    body: TurnCreate,
    request: Request,
    asking: AskingSession,
    idempotency_key: IdempotencyHeader = None,
) -> Response:
    """Run a turn. ``wait`` (default) answers with the ended turn; ``stream`` with its SSE
    events; ``wait=false`` with 202 and the accepted turn (queued, or running already). A
    retry with the same idempotency key gets the turn the first request made, in the same
    form."""
    return await answer_turn(asking, request, body, idempotency_key)


async def answer_turn(
    asking: Asking, request: Request, body: TurnCreate, idempotency_key: str | None
) -> Response:
    """What ``POST /v1/sessions/{sid}/turns`` answers once its request has been read: by the
    route, or by :class:`~tether.server.turn_lane.TurnLane` past FastAPI's machinery."""
    st, caller, key = asking.st, asking.caller, asking.key
    check_message(st, body.input)
    if idempotency_key and body.idempotency_key and idempotency_key != body.idempotency_key:
        # As with If-Match and a body revision that disagree: the request contradicts itself.
        raise Conflict("the Idempotency-Key header and idempotency_key differ; send one")
    # A session made by the Python API before any agent names none: the app's first answers.
    first = st.agents[0].name if st.agents else ""

    def own_agent(name: str) -> AgentRef:
        return st.runtime.served(name or first).ref

    # The session is not read here: the admission finds it (404 when it is not the caller's
    # or has expired), and its agent is read by the scheduler only when not known already.
    # A caller that waits for the outcome anyway may wait for room in a full queue
    # (backpressure); a fire-and-forget submission gets 429 at once.
    turn = await st.runtime.scheduler.submit(
        key,
        body.input,
        policy=body.policy,
        principal=caller,
        wait_for_slot=st.settings.admission_wait if body.wait or body.stream else 0.0,
        agent=st.runtime.served(body.agent).ref if body.agent else None,
        own_agent=own_agent,
        idempotency_key=idempotency_key or body.idempotency_key,
    )
    if body.stream:
        return event_stream(st, key, turn.id, 0, body.on_disconnect)
    location = f"/v1/sessions/{key.session_id}/turns/{turn.id}"
    if not body.wait:
        return JSONResponse(
            TurnOut.of(turn).model_dump(mode="json"),
            status_code=202,
            headers={"Location": location},
        )
    done = await wait_for_turn(st, request, turn, body.on_disconnect)
    if done is None:
        return Response(status_code=499)  # nobody is listening any more
    if not done.ended:
        return await parked_response(st, done, location)
    return turn_response(done)


async def parked_response(st: ServerState, turn: Turn, location: str) -> JSONResponse:
    """A turn that waits for a human: 202 with what it waits for — its own decisions, or, when
    it is queued behind a turn awaiting input (``behind``), that turn's. Decide them, then
    follow or wait for the turn."""
    scheduler = st.runtime.scheduler
    ahead = await scheduler.parked_ahead(turn)
    waits_on = ahead.id if ahead is not None else turn.id
    pending = await scheduler.decisions(turn.key, turn_id=waits_on, status="pending")
    out = TurnOut.of(turn, pending, behind=ahead.id if ahead is not None else None)
    return JSONResponse(
        out.model_dump(mode="json"), status_code=202, headers={"Location": location}
    )


@router.get("", responses=NOT_FOUND)
async def list_turns(
    st: State,
    key: Key,
    _: OwnSession,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=sse.MAX_SEQ)] = None,
) -> TurnPage:
    """The session's turns in order; pass ``next_cursor`` back as ``cursor``."""
    turns = await st.runtime.sessions.turns(key, after=cursor or 0, limit=limit + 1)
    page = turns[:limit]
    # A turn awaiting input lists the decisions it waits for, here as in GET …/turns/{tid}:
    # the session's pending ones, read once when the page holds such a turn.
    pending: dict[str, list[Decision]] = {}
    if any(t.status == "awaiting_input" for t in page):
        for d in await st.runtime.scheduler.decisions(key, status="pending"):
            pending.setdefault(d.turn_id, []).append(d)
    return TurnPage(
        data=[TurnOut.of(t, pending.get(t.id)) for t in page],
        next_cursor=str(page[-1].seq) if len(turns) > limit and page else None,
    )


async def _own_turn(st: ServerState, key: SessionKey, tid: str) -> Turn:
    if not minted(tid):
        raise TurnNotFound("turn not found")
    turn = await st.runtime.sessions.turn(key, tid)
    if turn is None:
        raise TurnNotFound("turn not found")
    return turn


@router.get("/{tid}", responses=NOT_FOUND)
async def get_turn(tid: str, st: State, key: Key, _: OwnSession) -> TurnOut:
    """One turn with its status, reason, output and usage; a turn awaiting input lists the
    decisions it waits for."""
    turn = await _own_turn(st, key, tid)
    if turn.status != "awaiting_input":
        return TurnOut.of(turn)
    pending = await st.runtime.scheduler.decisions(key, turn_id=tid, status="pending")
    return TurnOut.of(turn, pending)


@router.get(
    "/{tid}/events",
    responses={
        200: {"content": SSE},
        204: {"description": "Last-Event-ID names the turn's turn.ended: the stream is over"},
        **NOT_FOUND,
    },
    response_class=StreamingResponse,
)
async def turn_events(
    tid: str,
    st: State,
    key: Key,
    _: OwnSession,
    last_event_id: Annotated[
        str | None,
        Header(
            max_length=200,
            description="``<turn id>:<seq>`` of this turn's last event you got.",
            json_schema_extra={"pattern": sse.LAST_EVENT_ID},
        ),
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=sse.MAX_SEQ, description="resume after this seq")
    ] = None,
) -> Response:
    """SSE: replays a finished turn, tails a running one; resumes after ``Last-Event-ID``.

    Resuming from the turn's ``turn.ended`` itself answers 204: the stream is over, and 204 is
    what tells an ``EventSource`` to stop reconnecting (a replayed ``turn.ended`` would make it
    reconnect for ever)."""
    turn = await _own_turn(st, key, tid)
    resume = sse.resume_point(tid, last_event_id, after)
    if turn.ended and resume and await _ended_at(st, key, tid, resume):
        return Response(status_code=204)
    return event_stream(st, key, tid, resume, "continue")


async def _ended_at(st: ServerState, key: SessionKey, tid: str, seq: int) -> bool:
    """Whether a client that got the ended turn's event ``seq`` has had its ``turn.ended``:
    ``seq`` is that event, or past every stored one (seqs only grow, and the ending is the
    last).

    A client of a process that died mid-turn may hold ids past the stored events (live events
    run ahead of the store), but the ending its recovery wrote skips past all of those
    (``rules.LIVE_AHEAD``): resumed from any of them, it is replayed, as it is owed."""
    events = st.runtime.scheduler.events(key, tid, after_seq=seq - 1)
    try:
        first = await anext(events, None)
    finally:
        await events.aclose()
    # Past it, the replay gives the ending anyway (its seq below ``seq``): owed to a client of
    # a dead process, whose ids are below it, not to one that has it.
    return first is None or (first.type == TURN_ENDED and first.seq <= seq)


@router.post("/{tid}/cancel", responses=NOT_FOUND)
async def cancel_turn(tid: str, st: State, key: Key, _: OwnSession) -> TurnOut:
    """Cancel a queued or running turn; answers with the ended turn (an ended one as it is)."""
    await _own_turn(st, key, tid)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            return TurnOut.of(await st.runtime.scheduler.cancel(key, tid, "cancelled"))
    return TurnOut.of(await _own_turn(st, key, tid))


@router.post(
    "/{tid}/decisions",
    responses={
        **NOT_FOUND,
        400: {"description": "a decision this kind does not take (an answer outside choices)"},
        409: {"description": "not pending any more: the body's decision is the first one"},
    },
)
async def decide(
    tid: str, body: DecisionIn, st: State, caller: Caller, key: Key, _: OwnSession
) -> DecisionOut:
    """Decide what a turn awaiting input asks (``decision.requested``), from any process:
    approve, deny or always (this tool, for the rest of the session) an approval; answer (or
    deny) a question. The turn then goes on wherever the session is taken next."""
    await _own_turn(st, key, tid)
    done = await st.runtime.scheduler.decide(
        key, tid, body.call_id, body.verdict(), answer=body.answer, by=caller.user, principal=caller
    )
    return DecisionOut.of(done)


@router.get("/{tid}/decisions", responses=NOT_FOUND)
async def turn_decisions(tid: str, st: State, key: Key, _: OwnSession) -> DecisionList:
    """Every decision the turn asked for, oldest first."""
    await _own_turn(st, key, tid)
    return DecisionList(
        decisions=[
            DecisionOut.of(d) for d in await st.runtime.scheduler.decisions(key, turn_id=tid)
        ]
    )
