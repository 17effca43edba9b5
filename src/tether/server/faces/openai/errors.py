"""OpenAI's error shape, ``{"error": {message, type, param, code}}``, for everything the face
refuses, and how a turn that did not complete is told in it."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from tether.errors import TetherError
from tether.records import Principal, Turn
from tether.server.faces.endings import Waiting, withdrawn_if_behind
from tether.server.problems import Problem, from_error, problem_response
from tether.server.routes.outcomes import turn_problem
from tether.server.schemas import IDEMPOTENCY_KEY
from tether.server.state import ServerState

SESSION_HEADER = "X-Tether-Session"

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
    """A refusal in OpenAI's words: the status, the message, and OpenAI's ``code``/``param``."""

    def __init__(
        self, status: int, message: str, code: str | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_body(status: int, message: str, code: str | None, param: str | None) -> dict[str, Any]:
    kind = _TYPES.get(status, "api_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error in OpenAI's shape. Every 409 tells the SDK not to retry (it retries 409s by
    default): a conflict answers the same again, or the retry would be one more turn."""
    if status == 409:
        headers = no_retry(headers or {})
    return JSONResponse(error_body(status, message, code, param), status, headers=headers)


def _code(problem: dict[str, Any]) -> str | None:
    """The OpenAI ``code`` of a tether problem: its type's last part, in OpenAI's spelling
    (``turn-failed`` is ``turn_failed``)."""
    return str(problem.get("type", "")).rsplit("/", 1)[-1].replace("-", "_") or None


def from_problem(problem: JSONResponse, headers: dict[str, str] | None = None) -> JSONResponse:
    """A tether problem+json answer, restated in OpenAI's error shape (same status, same words,
    same headers such as ``WWW-Authenticate`` and ``Retry-After``)."""
    body = json.loads(bytes(problem.body))
    code = _code(body)
    message = str(body.get("detail") or body.get("title") or "error")
    kept = {
        k: v for k, v in problem.headers.items() if k.lower() in ("www-authenticate", "retry-after")
    }
    return error_response(problem.status_code, message, code, headers={**kept, **(headers or {})})


def problem_of(exc: TetherError | Problem) -> JSONResponse:
    if isinstance(exc, TetherError):
        return from_error(exc)
    return problem_response(
        exc.status, exc.kind, exc.title, exc.detail, headers=exc.headers, **exc.extra
    )


def refusal(exc: FaceError | TetherError | Problem, headers: dict[str, str] | None) -> JSONResponse:
    """Any refusal before a turn answers, in OpenAI's shape. A 404 names no session in
    ``X-Tether-Session``: that header is where a client reads the session to go on with, and
    there is none (an unknown one asked for would be echoed back as if it were)."""
    if headers and SESSION_HEADER in headers and _status_of(exc) == 404:
        headers = {k: v for k, v in headers.items() if k != SESSION_HEADER}
    if isinstance(exc, FaceError):
        return error_response(exc.status, exc.message, exc.code, exc.param, headers)
    return from_problem(problem_of(exc), headers)


def _status_of(exc: FaceError | TetherError | Problem) -> int:
    if isinstance(exc, FaceError):
        return exc.status
    return problem_of(exc).status_code


async def caller_of(st: ServerState, request: Request) -> Principal:
    """The principal, as every door resolves it; the placeholder key an SDK insists on sending
    is local mode's while no API key exists."""
    return await st.auth.resolve(request, placeholder_keys=True)


def no_retry(headers: dict[str, str]) -> dict[str, str]:
    """OpenAI's SDKs retry 409s, 429s and 5xx by default; a retry of a turn that ran would
    be a second turn (and the provider's retries times the SDK's)."""
    return {**headers, "x-should-retry": "false"}


def idempotency_key(request: Request) -> str | None:
    """``Idempotency-Key``: a retry with it gets the turn the first request made (DESIGN §9)."""
    key = request.headers.get("idempotency-key")
    if key is None:
        return None
    if not (0 < len(key) <= 255 and _IDEMPOTENCY.fullmatch(key)):
        raise FaceError(400, "Idempotency-Key is 1-255 printable ASCII characters", "invalid_value")
    return key


_IDEMPOTENCY = re.compile(IDEMPOTENCY_KEY)


def awaiting_message(turn: Turn) -> str:
    sid = turn.key.session_id
    return (
        f"turn {turn.id} is waiting for a human decision; decide it through tether's API "
        f"(GET /v1/sessions/{sid}/turns/{turn.id}/decisions, then POST there) and follow the "
        "turn to its reply"
    )


async def outcome_error(st: ServerState, turn: Turn, headers: dict[str, str]) -> JSONResponse:
    """A turn that did not complete (or waits for a human), as an OpenAI error: never an empty
    answer. The turn ran (tether retried its model already), so the SDK must not retry: each
    retry would be one more turn. Refusals before a turn (a full queue) stay retryable. A turn
    queued behind one that waits for a human is withdrawn, and the error says so: told that
    it failed, the client must not find its message answered later."""
    if not turn.ended:
        wait = await withdrawn_if_behind(st, turn)
        message = wait.message if wait is not None else awaiting_message(turn)
        return error_response(409, message, "awaiting_input", None, no_retry(headers))
    return from_problem(turn_problem(turn), no_retry(headers))


def waiting_error(wait: Waiting) -> dict[str, Any]:
    """The error a stream ends with when its turn was withdrawn from behind a human's decision."""
    return error_body(409, wait.message, "awaiting_input", None)


def stream_error(turn: Turn) -> dict[str, Any]:
    """The error a stream ends with when its turn did not complete (the SDK raises it)."""
    if not turn.ended:
        return error_body(409, awaiting_message(turn), "awaiting_input", None)
    problem = turn_problem(turn)
    body = json.loads(bytes(problem.body))
    return error_body(problem.status_code, str(body.get("detail")), _code(body), None)


ERROR_SCHEMA = {
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


def documented(codes: dict[int, str], body: bool = True) -> dict[int | str, dict[str, Any]]:
    """OpenAI-shaped error responses for OpenAPI (``{404: "…"}``); a body over the server's
    bound is refused before any route (413, problem+json)."""
    out: dict[int | str, dict[str, Any]] = {
        code: {
            "description": text,
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        for code, text in codes.items()
    }
    if not body:
        return out
    out[413] = {
        "description": "the body or message is over its size bound",
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }
    return out


TURN_ERRORS = {
    400: "a malformed body (not JSON, no user message, bad content) or session id",
    401: "no valid API key",
    404: "no agent of that name (model_not_found), or no such session of yours",
    409: "the turn was cancelled or interrupted, or waits for a human decision",
    422: "the turn hit a limit",
    429: "a queue or a bound of the caller is full",
    500: "the turn failed inside the server",
    502: "the model provider failed",
    503: "the store is unreachable, or the server running the turn stopped",
}
