"""``GET /v1/models`` and ``POST /v1/chat/completions``, streaming or not.

``model`` names one of the app's agents. The conversation is the caller's session named by the
``X-Tether-Session`` header (or ``metadata.session_id``); a session the caller does not have is
a 404 (``session_not_found``), never a fresh chat. With no session the call is a one-off on a
fresh session, whose id comes back in the ``X-Tether-Session`` response header: send it with
the next call to continue. What counts as the turn's input is in :mod:`.inputs`.

Only a completed turn is a ``chat.completion``. Any other end is an error in OpenAI's shape: a
plain HTTP error without streaming; with ``stream: true`` a final ``{"error": …}`` chunk (the
SDK raises it) after whatever text had streamed, and no ``[DONE]``. The agent's own tool calls
run inside tether and are not sent to the client. A client that goes away mid-stream does not
cancel the turn (its reply is kept in the session).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tether.errors import AgentNotFound, SessionNotFound, TetherError
from tether.events import MESSAGE_COMPLETED, MESSAGE_DELTA, TURN_AWAITING_INPUT, TURN_ENDED
from tether.records import Principal, SessionKey, Turn
from tether.server import sse
from tether.server.conversation import Opened, agent_named, open_session, send
from tether.server.deps import State
from tether.server.faces.endings import Waiting, unless_behind_a_human
from tether.server.faces.openai.errors import (
    SESSION_HEADER,
    TURN_ERRORS,
    FaceError,
    caller_of,
    documented,
    idempotency_key,
    outcome_error,
    refusal,
    stream_error,
    waiting_error,
)
from tether.server.faces.openai.inputs import (
    checked_session,
    conversation_input,
    flag,
    header_session,
    model_of,
    no_client_tools,
    read_body,
)
from tether.server.faces.openai.said import SEPARATOR, said
from tether.server.problems import Problem
from tether.server.routes.turns import wait_for_turn
from tether.server.schemas import IDEMPOTENCY_KEY, NO_NUL
from tether.server.state import ServerState

router = APIRouter(tags=["openai"])

SESSION_ID_SCHEMA = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{0,128}$", "maxLength": 128}
_TEXT = {"type": "string", "pattern": NO_NUL}
_PART = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"const": "text"}, "text": _TEXT},
}
_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [_TEXT, {"type": "array", "items": _PART}]},
        # Read by the code the Responses face shares: a message item, if it says.
        "type": {"const": "message"},
    },
}
_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": {"type": "string", "minLength": 1, "description": "An agent's name."},
        "messages": {
            "type": "array",
            "minItems": 1,
            "items": _MESSAGE,
            "contains": {"type": "object", "properties": {"role": {"const": "user"}}},
            "description": "With a session, only the last user message is the turn's input "
            "(the history is tether's); without one, earlier messages are given to the "
            "turn as a transcript.",
        },
        "metadata": {"type": "object", "properties": {"session_id": SESSION_ID_SCHEMA}},
        "stream": {"type": "boolean"},
        "stream_options": {
            "type": "object",
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "tools": {"type": "array", "maxItems": 0, "description": "Not supported: the agent's."},
        "n": {"type": "integer", "minimum": 1, "maximum": 1, "description": "A turn has one."},
    },
}
IDEMPOTENCY_PARAM = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": IDEMPOTENCY_KEY},
    "description": "Retries with this key (same session, same request, within a day) get the "
    "turn the first one made.",
}
_COMPLETIONS_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": SESSION_HEADER,
            "in": "header",
            "required": False,
            "schema": SESSION_ID_SCHEMA,
            "description": "Your session the turn continues (404 if you have none of that id); "
            "omit for a one-off turn on a fresh session.",
        },
        IDEMPOTENCY_PARAM,
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST}}},
}
_COMPLETIONS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "a chat.completion; with stream: true, chat.completion.chunk events",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    },
    **documented(TURN_ERRORS),
}

STARTED = int(time.time())
"""A model's ``created``: when this process began serving it."""


@router.get(
    "/v1/models",
    responses=documented(
        {400: "ambiguous credentials", 401: "no valid API key", 503: "the store is unreachable"},
        body=False,
    ),
)
async def models(request: Request, st: State) -> Response:
    """The app's agents, as OpenAI models."""
    try:
        await caller_of(st, request)
    except (TetherError, Problem) as exc:
        return refusal(exc, None)
    return JSONResponse({"object": "list", "data": [_model(a.name) for a in st.agents]})


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": STARTED, "owned_by": "tether"}


@router.get(
    "/v1/models/{model}",
    responses=documented(
        {
            400: "ambiguous credentials",
            401: "no valid API key",
            404: "no agent of that name",
            503: "the store is unreachable",
        },
        body=False,
    ),
)
async def retrieve_model(model: str, request: Request, st: State) -> Response:
    """One of the app's agents, as an OpenAI model (``client.models.retrieve``)."""
    try:
        await caller_of(st, request)
        _known_model(st, model)
    except (FaceError, TetherError, Problem) as exc:
        return refusal(exc, None)
    return JSONResponse(_model(model))


def _known_model(st: ServerState, model: str) -> None:
    try:
        agent_named(st, model)
    except AgentNotFound:
        message = f"the model {model!r} does not exist"
        raise FaceError(404, message, "model_not_found", "model") from None


def _no_session(session_id: str | None, missing: FaceError | None) -> FaceError:
    if missing is not None:
        return missing
    message = f"no session {session_id!r}: omit {SESSION_HEADER} to start one"
    return FaceError(404, message, "session_not_found")


async def open_for(
    st: ServerState,
    caller: Principal,
    model: str,
    session_id: str | None,
    text: str,
    missing: FaceError | None = None,
) -> Opened:
    """The caller's session for a turn of ``model``, in OpenAI's words when it is not there."""
    _known_model(st, model)
    try:
        # A call without a session is a one-off: its session is kept a while after its latest
        # turn (its client may go on with it), not for ever.
        ttl = st.settings.one_off_ttl if session_id is None else None
        return await open_session(
            st, caller, session_id, model, create=False, message=text, idle_ttl=ttl
        )
    except SessionNotFound:
        raise _no_session(session_id, missing) from None


async def send_for(
    st: ServerState,
    caller: Principal,
    model: str,
    session_id: str | None,
    text: str,
    idempotency_key: str | None,
    missing: FaceError | None = None,
) -> Turn:
    """:func:`open_for` and submit, without a store call first for a session that is there."""
    _known_model(st, model)
    try:
        ttl = st.settings.one_off_ttl if session_id is None else None
        return await send(
            st,
            caller,
            session_id,
            text,
            model,
            create=False,
            idle_ttl=ttl,
            idempotency_key=idempotency_key,
        )
    except SessionNotFound:
        raise _no_session(session_id, missing) from None


@router.post(
    "/v1/chat/completions", openapi_extra=_COMPLETIONS_DOC, responses=_COMPLETIONS_RESPONSES
)
async def chat_completions(request: Request, st: State) -> Response:
    """An OpenAI chat completion answered by the agent ``model`` names."""
    session_id: str | None = None
    try:
        caller = await caller_of(st, request)
        body = await read_body(request)
        model = model_of(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise FaceError(400, "messages must be a non-empty list", "invalid_value", "messages")
        metadata = body.get("metadata")
        in_header = header_session(request)
        in_body = (
            checked_session(metadata.get("session_id"), "metadata")
            if isinstance(metadata, dict)
            else None
        )
        if in_header and in_body and in_header != in_body:
            # Which one the client meant would be a guess (the header used to win, silently).
            raise FaceError(
                400,
                f"the {SESSION_HEADER} header and metadata.session_id name different sessions; "
                "send one",
                "invalid_value",
                "metadata",
            )
        session_id = in_header or in_body
        text = conversation_input(messages, session_id is not None, "messages")
        stream = flag(body, "stream")
        usage = _include_usage(body)
        no_client_tools(body)
        _one_choice(body)
        turn = await send_for(st, caller, model, session_id, text, idempotency_key(request))
    except (FaceError, TetherError, Problem) as exc:
        return refusal(exc, _sid(session_id))
    headers = {SESSION_HEADER: turn.key.session_id}
    if stream:
        return StreamingResponse(
            sse.encoded(_chunks(st, turn, model, usage), _data_frame),
            media_type="text/event-stream",
            headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    done = await wait_for_turn(st, request, turn, "continue")
    if done is None:
        return Response(status_code=499)
    if done.status != "completed":
        return await outcome_error(st, done, headers)
    text = SEPARATOR.join(await said(st, done))
    return JSONResponse(_completion(done, model, text), headers=headers)


def _one_choice(body: dict[str, Any]) -> None:
    """``n`` above 1 asks for several answers to one message: a turn has one (a request that
    asked for two and got one, said nothing)."""
    n = body.get("n")
    if n is not None and (isinstance(n, bool) or n != 1):
        raise FaceError(400, "n must be 1: a turn has one answer", "invalid_value", "n")


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise FaceError(400, "stream_options must be an object", "invalid_value", "stream_options")
    return flag(options, "include_usage")


def _sid(session_id: str | None) -> dict[str, str] | None:
    return {SESSION_HEADER: session_id} if session_id else None


def _usage(turn: Turn) -> dict[str, int]:
    prompt, completion = turn.usage.input_tokens, turn.usage.output_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish_reason(turn: Turn) -> str:
    return "stop" if turn.complete else "length"


def _completion(turn: Turn, model: str, text: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{turn.id}",
        "object": "chat.completion",
        "created": int(turn.ended_at or turn.created_at),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": _finish_reason(turn),
            }
        ],
        "usage": _usage(turn),
    }


_DONE = "[DONE]"


def _data_frame(item: dict[str, Any] | str) -> bytes:
    data = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


async def _chunks(
    st: ServerState, turn: Turn, model: str, include_usage: bool
) -> AsyncIterator[dict[str, Any] | str]:
    """The turn as ``chat.completion.chunk``s: the role, a chunk per streamed piece of text,
    the finish reason (and the usage, when asked), then ``[DONE]``; or an error chunk."""
    head = {
        "id": f"chatcmpl-{turn.id}",
        "object": "chat.completion.chunk",
        "created": int(turn.created_at),
        "model": model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None  # as OpenAI: every chunk but the last carries a null usage
        return out

    yield chunk({"role": "assistant", "content": ""})
    key = turn.key
    # Messages after the first begin with SEPARATOR, as a plain completion joins them; a
    # message that came whole (no pieces) is sent whole.
    wrote = streaming = False
    async for event in unless_behind_a_human(st, turn, st.runtime.scheduler.events(key, turn.id)):
        if isinstance(event, Waiting):
            yield waiting_error(event)
            return
        if event.type in (MESSAGE_DELTA, MESSAGE_COMPLETED):
            text = str(event.data.get("text") or "")
            whole = event.type == MESSAGE_COMPLETED
            if whole and streaming:  # the message ends; its pieces were sent
                streaming = False
                continue
            if text:
                if wrote and not streaming:
                    text = SEPARATOR + text
                streaming, wrote = not whole, True
                yield chunk({"content": text})
        elif event.type in (TURN_AWAITING_INPUT, TURN_ENDED):
            done = await _read(st, key, turn.id)
            if done.status != "completed":
                yield stream_error(done)
                return
            yield chunk({}, _finish_reason(done))
            if include_usage:
                yield {**head, "choices": [], "usage": _usage(done)}
            yield _DONE
            return


async def _read(st: ServerState, key: SessionKey, turn_id: str) -> Turn:
    turn = await st.runtime.sessions.turn(key, turn_id)
    if turn is None:  # the session was deleted under the stream
        raise SessionNotFound("session not found")
    return turn
