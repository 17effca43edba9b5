"""The OpenAI-compatible face: ``GET /v1/models`` and ``POST /v1/chat/completions``.

``model`` names one of the app's agents. The conversation is the session named by the
``X-Tether-Session`` header (or ``metadata.session_id``) in the caller's namespace, made if new;
its history lives in tether's store, so only the *last* user message of ``messages`` is the new
input and earlier messages are ignored (a client that resends the whole history does not
duplicate it). With no session, each call is a one-off turn on a fresh session. The session id
comes back in the ``X-Tether-Session`` response header.

Only a completed turn is a ``chat.completion``; any other end is an error in OpenAI's shape
``{"error": {message, type, param, code}}`` (cancelled or interrupted 409, a failed model 502,
a limit 422, a turn waiting for a human decision 409: decide it through tether's own API).
Streaming (``stream: true``) is not served yet: it is refused with a 400.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from tether.errors import AgentNotFound, SessionNotFound, TetherError
from tether.records import SESSION_ID_PATTERN, Principal, Turn
from tether.server.conversation import agent_named, run_turn
from tether.server.deps import State
from tether.server.problems import Problem, from_error, problem_response
from tether.server.routes.outcomes import turn_problem
from tether.server.schemas import NO_NUL
from tether.server.state import ServerState

router = APIRouter(tags=["openai"])

SESSION_HEADER = "X-Tether-Session"

_SESSION_ID = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{0,128}$", "maxLength": 128}
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
            "description": "Only the last user message is the turn's input; with a session, "
            "the history is tether's and earlier messages are ignored.",
        },
        "metadata": {"type": "object", "properties": {"session_id": _SESSION_ID}},
        "stream": {"enum": [False], "description": "Streaming is not served yet."},
    },
}
_COMPLETIONS_DOC: dict[str, Any] = {
    "parameters": [
        {
            "name": SESSION_HEADER,
            "in": "header",
            "required": False,
            "schema": _SESSION_ID,
            "description": "The session (yours) the turn continues; omit for a one-off turn.",
        }
    ],
    "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST}}},
}

_STARTED = int(time.time())
"""A model's ``created``: when this process began serving it."""

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class FaceError(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    kind = _TYPES.get(status, "api_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _from_problem(problem: JSONResponse, headers: dict[str, str] | None = None) -> JSONResponse:
    """A tether problem+json answer, restated in OpenAI's error shape (same status, same words,
    same headers such as ``WWW-Authenticate`` and ``Retry-After``)."""
    body = json.loads(bytes(problem.body))
    code = str(body.get("type", "")).rsplit("/", 1)[-1] or None
    message = str(body.get("detail") or body.get("title") or "error")
    kept = {
        k: v for k, v in problem.headers.items() if k.lower() in ("www-authenticate", "retry-after")
    }
    return error_response(problem.status_code, message, code, headers={**kept, **(headers or {})})


def _problem_of(exc: TetherError | Problem) -> JSONResponse:
    if isinstance(exc, TetherError):
        return from_error(exc)
    return problem_response(
        exc.status, exc.kind, exc.title, exc.detail, headers=exc.headers, **exc.extra
    )


_ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def _errors(**codes: str) -> dict[int | str, dict[str, Any]]:
    """OpenAI-shaped error responses (``e404="…"``); a body over the server's bound is refused
    before any route (413, problem+json)."""
    out: dict[int | str, dict[str, Any]] = {
        int(code.removeprefix("e")): {
            "description": text,
            "content": {"application/json": {"schema": _ERROR_SCHEMA}},
        }
        for code, text in codes.items()
    }
    return out


_MODELS_RESPONSES = _errors(
    e400="ambiguous credentials", e401="no valid API key", e503="the store is unreachable"
)
_COMPLETIONS_RESPONSES = {
    **_errors(
        e400="a malformed body (not JSON, no user message, bad content) or session id",
        e401="no valid API key",
        e404="no agent of that name (model_not_found)",
        e409="the turn was cancelled or interrupted, or waits for a human decision",
        e422="the turn hit a limit",
        e429="a queue or a bound of the caller is full",
        e500="the turn failed inside the server",
        e502="the model provider failed",
        e503="the store is unreachable, or the server running the turn stopped",
    ),
    413: {
        "description": "the body or message is over its size bound",
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    },
}


@router.get("/v1/models", responses=_MODELS_RESPONSES)
async def models(request: Request, st: State) -> Response:
    """The app's agents, as OpenAI models."""
    try:
        await st.auth.resolve(request, placeholder_keys=True)
    except (TetherError, Problem) as exc:
        return _from_problem(_problem_of(exc))
    data = [
        {"id": a.name, "object": "model", "created": _STARTED, "owned_by": "tether"}
        for a in st.agents
    ]
    return JSONResponse({"object": "list", "data": data})


@router.post(
    "/v1/chat/completions", openapi_extra=_COMPLETIONS_DOC, responses=_COMPLETIONS_RESPONSES
)
async def chat_completions(request: Request, st: State) -> Response:
    """An OpenAI chat completion answered by the agent ``model`` names (non-streaming)."""
    session_id: str | None = None
    try:
        caller = await st.auth.resolve(request, placeholder_keys=True)
        body = await _body(request)
        model, text, session_id, stream = _parse(body, request)
        if stream:
            raise FaceError(400, "stream: true is not supported yet", "unsupported", "stream")
        done = await _run(st, request, caller, model, text, session_id)
    except FaceError as exc:
        return error_response(exc.status, exc.message, exc.code, exc.param, _sid(session_id))
    except (TetherError, Problem) as exc:
        return _from_problem(_problem_of(exc), _sid(session_id))
    if isinstance(done, Response):
        return done
    usage = done.usage
    prompt, completion = usage.input_tokens, usage.output_tokens
    out = {
        "id": f"chatcmpl-{done.id}",
        "object": "chat.completion",
        "created": int(done.ended_at or done.created_at),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": done.output or ""},
                "finish_reason": "stop" if done.complete else "length",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
    return JSONResponse(out, headers={SESSION_HEADER: done.key.session_id})


def _no_retry(headers: dict[str, str]) -> dict[str, str]:
    """OpenAI's SDKs retry a 409 by default; a retry here would be a second turn."""
    return {**headers, "x-should-retry": "false"}


def _sid(session_id: str | None) -> dict[str, str] | None:
    return {SESSION_HEADER: session_id} if session_id else None


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        raise FaceError(400, "the request body is not valid JSON", "malformed_json") from None
    if not isinstance(body, dict):
        raise FaceError(400, "the request body must be a JSON object", "invalid_body")
    return body


def _parse(body: dict[str, Any], request: Request) -> tuple[str, str, str | None, bool]:
    """(model, the last user message's text, session id or None, stream)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FaceError(
            400, "model must name one of this server's agents", "invalid_value", "model"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FaceError(400, "messages must be a non-empty list", "invalid_value", "messages")
    last = next(
        (m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), None
    )
    if last is None:
        raise FaceError(400, "messages holds no user message", "invalid_value", "messages")
    text = _text(last.get("content"))
    metadata = body.get("metadata")
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id and isinstance(metadata, dict):
        given = metadata.get("session_id")
        if given is not None and not isinstance(given, str):
            raise FaceError(
                400, "metadata.session_id must be a string", "invalid_value", "metadata"
            )
        session_id = given
    if session_id and not SESSION_ID_PATTERN.fullmatch(session_id):
        # Never echoed back: a header cannot hold what a JSON string can.
        raise FaceError(
            400,
            "a session id is 1-128 characters of letters, digits and '._:-'",
            "invalid_value",
            SESSION_HEADER if request.headers.get(SESSION_HEADER) else "metadata",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise FaceError(400, "stream must be true or false", "invalid_value", "stream")
    return model, text, session_id or None, stream


def _text(content: object) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": …}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise FaceError(400, "only text content parts are supported", "invalid_value")
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise FaceError(400, "a message's content must be text", "invalid_value", "messages")


async def _run(
    st: ServerState,
    request: Request,
    caller: Principal,
    model: str,
    text: str,
    session_id: str | None,
) -> Turn | Response:
    """The completed turn on the caller's session, or the error response to give instead."""
    try:
        agent_named(st, model)
    except AgentNotFound:
        message = f"the model {model!r} does not exist"
        raise FaceError(404, message, "model_not_found", "model") from None
    try:
        opened, done = await run_turn(st, request, caller, text, session_id, model, create=False)
    except SessionNotFound:
        message = f"no session {session_id!r}: omit {SESSION_HEADER} to start one"
        raise FaceError(404, message, "session_not_found") from None
    headers = {SESSION_HEADER: opened.key.session_id}
    if done is None:
        return Response(status_code=499)
    if not done.ended:
        message = (
            f"turn {done.id} is waiting for a human decision; decide it through tether's API "
            f"(GET /v1/sessions/{opened.key.session_id}/turns/{done.id}, then POST its "
            "/decisions) and follow the turn to its reply"
        )
        return error_response(409, message, "awaiting_input", headers=_no_retry(headers))
    if done.status != "completed":
        problem = turn_problem(done)
        if problem.status_code == 409:
            headers = _no_retry(headers)
        return _from_problem(problem, headers)
    return done
