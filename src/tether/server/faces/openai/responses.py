"""OpenAI's Responses API over tether's turns: ``POST /v1/responses``, ``GET /v1/responses/{id}``
and ``POST /v1/responses/{id}/cancel``.

A response is a turn. Its id, ``resp_<turn id>.<session id>``, names both, so any process can
find it in the store, and only in the caller's namespace: another principal's response is a
404 like one that never was.

Which conversation a response continues:

* ``previous_response_id``: that response's session. tether's conversations do not branch, so
  it must be the session's latest answer: a completed turn (or one still under way) after it is
  a 409 ``conversation_moved_on``. Turns after it that failed or were cancelled do not count.
  Requests continuing one response share an idempotency key made from its id, so the store
  admits one turn for them all; the same message again gets that turn.
* ``conversation`` (an id, or ``{"id": …}``): the caller's session of that id (404 if none).
* neither: a fresh session, the one-off of :mod:`.inputs`. Every response names its session in
  ``conversation.id`` and the ``X-Tether-Session`` header, so it can be continued either way.

``background: true`` answers at once with the queued response (poll it with GET; cancel it
with ``/cancel``). ``stream: true`` sends ``response.*`` events numbered by
``sequence_number``; ``GET`` with ``stream=true`` replays them (after ``starting_after``) and
follows the turn, so a background response is watched and a dropped stream resumed from any
process. A completed turn is ``completed`` (``incomplete`` when the reply was cut
at the output cap); a failed one ``failed`` with its ``error``; a cancelled, interrupted or
rolled-back one ``cancelled``. Without streaming or background a turn that did not complete is
an OpenAI error, as for chat completions; a stream ends with ``response.failed`` (its status
``failed`` or ``cancelled``) or, for a turn that waits for a human decision, an ``error`` event.
``instructions``, ``temperature``, ``store`` and such are the agent's business (a template) and
are ignored; client-side ``tools`` are refused.

This module holds the routes; the response object is :mod:`.response_objects`, its events
:mod:`.response_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tether.errors import IdempotencyKeyReused, SessionNotFound, TetherError
from tether.records import Principal, SessionKey, Turn
from tether.server import sse
from tether.server.conversation import Opened, as_taken, submit
from tether.server.deps import State
from tether.server.faces.openai.chat import (
    IDEMPOTENCY_PARAM,
    SESSION_ID_SCHEMA,
    open_for,
    send_for,
)
from tether.server.faces.openai.errors import (
    SESSION_HEADER,
    TURN_ERRORS,
    FaceError,
    caller_of,
    documented,
    idempotency_key,
    outcome_error,
    refusal,
)
from tether.server.faces.openai.inputs import (
    checked_session,
    conversation_input,
    flag,
    model_of,
    no_client_tools,
    read_body,
)
from tether.server.faces.openai.response_events import (
    as_created,
    frame,
    later_than,
    response_events,
)
from tether.server.faces.openai.response_objects import Asked, parse_id, response_object
from tether.server.faces.openai.said import said
from tether.server.problems import Problem
from tether.server.routes.turns import wait_for_turn
from tether.server.schemas import NO_NUL
from tether.server.state import ServerState

router = APIRouter(tags=["openai"])

_TEXT = {"type": "string", "pattern": NO_NUL}
_INPUT_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "type": {"const": "message"},
        "role": {"enum": ["system", "developer", "user", "assistant"]},
        "content": {
            "anyOf": [
                _TEXT,
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {
                            "type": {"enum": ["input_text", "output_text", "text"]},
                            "text": _TEXT,
                        },
                    },
                },
            ]
        },
    },
}
_REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "not": {"required": ["previous_response_id", "conversation"]},
    "properties": {
        "model": {"type": "string", "minLength": 1, "description": "An agent's name."},
        "input": {
            "anyOf": [
                _TEXT,
                {
                    "type": "array",
                    "minItems": 1,
                    "items": _INPUT_MESSAGE,
                    "contains": {"type": "object", "properties": {"role": {"const": "user"}}},
                },
            ]
        },
        "previous_response_id": {"type": "string", "minLength": 1, "maxLength": 200},
        "conversation": {
            "anyOf": [
                SESSION_ID_SCHEMA,
                {"type": "object", "required": ["id"], "properties": {"id": SESSION_ID_SCHEMA}},
            ]
        },
        "stream": {"type": "boolean"},
        "background": {"type": "boolean"},
        "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        "tools": {"type": "array", "maxItems": 0, "description": "Not supported: the agent's."},
    },
}
_RESPONSE_ID = {"type": "string", "minLength": 1, "maxLength": 200}


def _a_response(description: str) -> dict[str, Any]:
    """A 200 that is a response object, or its events when streamed."""
    return {
        "description": description,
        "content": {
            "application/json": {"schema": {"type": "object"}},
            "text/event-stream": {"schema": {"type": "string"}},
        },
    }


_CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _a_response("a response; with stream: true, response.* events"),
    **documented(
        {
            **TURN_ERRORS,
            409: TURN_ERRORS[409] + "; or the conversation moved on past previous_response_id",
        }
    ),
}
_READ_RESPONSES = documented(
    {
        400: "ambiguous credentials; stream or starting_after malformed",
        401: "no valid API key",
        404: "no such response of yours",
        503: "the store is unreachable",
    },
    body=False,
)


async def _own_turn(st: ServerState, caller: Principal, value: str) -> Turn:
    turn_id, session_id = parse_id(value)
    key = SessionKey.of(caller, session_id)
    try:
        await st.runtime.sessions.own(key)
    except SessionNotFound:
        raise FaceError(404, "no such response", "response_not_found") from None
    turn = await st.runtime.sessions.turn(key, turn_id)
    if turn is None:
        raise FaceError(404, "no such response", "response_not_found")
    return turn


@router.post(
    "/v1/responses",
    openapi_extra={
        "parameters": [IDEMPOTENCY_PARAM],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST}}},
    },
    responses=_CREATE_RESPONSES,
)
async def create_response(request: Request, st: State) -> Response:
    """A response of the agent ``model`` names, continuing ``previous_response_id`` or
    ``conversation`` (or a fresh session)."""
    session_id: str | None = None
    asked_at = time.time()
    try:
        caller = await caller_of(st, request)
        body = await read_body(request)
        model = model_of(body)
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise FaceError(400, "previous_response_id must be a string", "invalid_value")
        session_id = await _session_of(st, caller, previous, body.get("conversation"))
        text = _input_text(body.get("input"), session_id is not None)
        stream, background = flag(body, "stream"), flag(body, "background")
        metadata = _metadata(body.get("metadata"))
        no_client_tools(body)
        retry = idempotency_key(request)
        if previous:
            opened = await open_for(st, caller, model, session_id, text, _missing(previous))
            turn = await _continue(st, opened, caller, previous, text)
        else:
            turn = await send_for(st, caller, model, session_id, text, retry, _missing(None))
    except (FaceError, TetherError, Problem) as exc:
        return refusal(exc, {SESSION_HEADER: session_id} if session_id else None)
    headers = {SESSION_HEADER: turn.key.session_id}
    asked = Asked(model, previous, metadata, background)
    if stream:
        # Its first event shows the turn as taken (queued), as a stream read again later does.
        return StreamingResponse(
            sse.encoded(response_events(st, as_taken(turn, asked_at), asked, live=turn), frame),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    if background:
        return JSONResponse(response_object(as_taken(turn, asked_at), asked), headers=headers)
    done = await wait_for_turn(st, request, turn, "continue")
    if done is None:
        return Response(status_code=499)
    if done.status != "completed":
        return await outcome_error(st, done, headers)
    return JSONResponse(response_object(done, asked, await said(st, done)), headers=headers)


_GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _a_response("the response; with stream=true, its response.* events"),
    **_READ_RESPONSES,
}


@router.get(
    "/v1/responses/{response_id}",
    responses=_GET_RESPONSES,
    openapi_extra={
        # Read from the query by hand: a malformed one is an OpenAI error, not FastAPI's 422.
        "parameters": [
            {
                "name": "stream",
                "in": "query",
                "description": "true: the response's events, replayed then followed",
                "schema": {"type": "boolean"},
            },
            {
                "name": "starting_after",
                "in": "query",
                "description": "with stream: only the events after this sequence_number",
                "schema": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
            },
        ]
    },
)
async def get_response(response_id: str, request: Request, st: State) -> Response:
    """A response as it stands (queued, in progress, or how it ended); with ``stream=true`` its
    ``response.*`` events from the first (or after ``starting_after``), as the request that
    made it streamed them, then followed live: how a background response is watched, or a
    dropped stream resumed, from any process."""
    try:
        caller = await caller_of(st, request)
        query = request.query_params
        streaming = _query_flag(query.get("stream"), "stream")
        after = _query_count(query.get("starting_after"), "starting_after")
        turn = await _own_turn(st, caller, response_id)
    except (FaceError, TetherError, Problem) as exc:
        return refusal(exc, None)
    if not streaming:
        return JSONResponse(response_object(turn, said=await said(st, turn)))
    events = response_events(st, as_created(turn), Asked())
    return StreamingResponse(
        sse.encoded(later_than(events, after), frame),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _query_flag(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise FaceError(400, f"{name} must be true or false", "invalid_value", name)


def _query_count(value: str | None, name: str) -> int:
    if value is None:
        return -1
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise FaceError(400, f"{name} must be a sequence_number (0 or more)", "invalid_value", name)
    return int(value)


@router.post("/v1/responses/{response_id}/cancel", responses=_READ_RESPONSES)
async def cancel_response(response_id: str, request: Request, st: State) -> Response:
    """Cancel a queued or running response; an ended one is answered as it is."""
    try:
        caller = await caller_of(st, request)
        turn = await _own_turn(st, caller, response_id)
        if not turn.ended:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    turn = await st.runtime.scheduler.cancel(turn.key, turn.id, "cancelled")
    except (FaceError, TetherError, Problem) as exc:
        return refusal(exc, None)
    return JSONResponse(response_object(turn, said=await said(st, turn)))


def _missing(previous: str | None) -> FaceError:
    """What a conversation the caller does not have is, in the Responses API's words."""
    if previous:
        return FaceError(
            404,
            f"no response {previous[:200]!r} (unknown or not yours)",
            "previous_response_not_found",
            "previous_response_id",
        )
    return FaceError(
        404,
        "no such conversation (unknown or not yours): omit conversation and "
        "previous_response_id to start one",
        "conversation_not_found",
        "conversation",
    )


async def _session_of(
    st: ServerState, caller: Principal, previous: str | None, conversation: object
) -> str | None:
    if previous and conversation is not None:
        raise FaceError(
            400,
            "previous_response_id and conversation cannot both be given",
            "invalid_value",
            "conversation",
        )
    if previous:
        return parse_id(previous)[1]
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    return checked_session(conversation, "conversation")


async def _continue(
    st: ServerState, opened: Opened, caller: Principal, previous: str, text: str
) -> Turn:
    """The turn that continues ``previous`` with ``text``, unless the conversation has moved
    on past it.

    Every request continuing one response is submitted under one idempotency key, made from
    that response's id: the store admits one turn for it, atomically, whatever the number of
    requests and processes. The same message again (a retry, with or without a key of its
    own) is answered with that turn; another message is a 409, as it would be once the first
    had answered. (Checked and then submitted, eight requests at once all went on.)"""
    key = opened.key
    turn_id, _ = parse_id(previous)
    before = await st.runtime.sessions.turn(key, turn_id)
    if before is None:
        raise FaceError(404, "no such response", "response_not_found", "previous_response_id")
    later = await st.runtime.sessions.turns(key, after=before.seq, limit=100)
    moved = [t for t in later if _moved_on(t)]
    # The first turn after it with this very message may be this request's own, made by an
    # earlier try: the key below tells.
    if moved and moved[0].input != text:
        raise _moved_on_error()
    # One key an attempt: after one that failed (or was cancelled) the conversation has not
    # moved on, and sending the message again is a new try, not that failure read back.
    attempt = sum(1 for t in later if t.ended and not _moved_on(t))
    retry = f"continues:{previous}:{attempt}"
    try:
        turn = await submit(st, opened, caller, text, idempotency_key=retry)
    except IdempotencyKeyReused:
        raise _moved_on_error() from None
    # A turn of another door (a conversation's, the native API's) may have come in between
    # meanwhile: this one then follows it, which is no continuation of ``previous``.
    between = await st.runtime.sessions.turns(key, after=before.seq, limit=100)
    if any(_moved_on(t) for t in between if t.seq < turn.seq):
        await st.runtime.scheduler.cancel(key, turn.id, "caller_cancelled")
        raise _moved_on_error()
    return turn


def _moved_on(turn: Turn) -> bool:
    """Whether a turn after a response moves the conversation past it."""
    return turn.status == "completed" or not turn.ended


def _moved_on_error() -> FaceError:
    return FaceError(
        409,
        "the conversation has moved on past this response, and tether's conversations do "
        "not branch: continue from its latest response",
        "conversation_moved_on",
        "previous_response_id",
    )


def _input_text(given: object, continuing: bool) -> str:
    if isinstance(given, str):
        return given
    if not isinstance(given, list) or not given:
        raise FaceError(400, "input must be text or a non-empty list", "invalid_value", "input")
    return conversation_input(given, continuing, "input")


def _metadata(given: object) -> dict[str, str]:
    if given is None:
        return {}
    if not isinstance(given, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in given.items()
    ):
        raise FaceError(400, "metadata maps strings to strings", "invalid_value", "metadata")
    return given
