"""RFC 9457 problem details: every error the API returns has this shape and a stable ``type``.

Error bodies never carry stack traces or raw exception text from inside the server: the
``detail`` comes from tether's own error messages, written for the caller.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from tether.errors import (
    Conflict,
    InvalidInput,
    ModelError,
    NotFound,
    QueueFull,
    SessionBusy,
    StoreError,
    TetherError,
    TooLarge,
)

log = logging.getLogger("tether.server")

PROBLEM_JSON = "application/problem+json"
BASE = "https://tether.dev/problems/"


class Unauthorized(TetherError):
    """No credentials, or credentials that are unknown or revoked."""


class Forbidden(TetherError):
    """The principal may not do this."""


class Problem(Exception):
    """An HTTP problem raised from a route (for the few not mapped from TetherError)."""

    def __init__(self, status: int, kind: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.extra = extra


def problem_response(
    status: int,
    kind: str,
    title: str,
    detail: str,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body = {"type": BASE + kind, "title": title, "status": status, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


# (error class, status, type, title) — the first matching class wins, so subclasses come first.
_MAP: list[tuple[type[TetherError], int, str, str]] = [
    (Unauthorized, 401, "unauthorized", "Unauthorized"),
    (Forbidden, 403, "forbidden", "Forbidden"),
    (NotFound, 404, "not-found", "Not found"),
    (QueueFull, 429, "queue-full", "Too many queued turns"),
    (SessionBusy, 409, "session-busy", "Session busy"),
    (Conflict, 409, "conflict", "Conflict"),
    (TooLarge, 413, "too-large", "Payload too large"),
    (InvalidInput, 400, "invalid-input", "Invalid input"),
    (StoreError, 503, "store-unavailable", "Store unavailable"),
    (ModelError, 502, "model-error", "Model error"),
]


def from_error(exc: TetherError) -> JSONResponse:
    for cls, status, kind, title in _MAP:
        if isinstance(exc, cls):
            extra: dict[str, Any] = {}
            headers: dict[str, str] | None = None
            if isinstance(exc, SessionBusy):
                extra["busy_turn_id"] = exc.busy_turn_id
            if isinstance(exc, Unauthorized):
                headers = {"WWW-Authenticate": "Bearer"}
            if isinstance(exc, NotFound):
                # Unknown and foreign must be indistinguishable: one fixed body.
                return problem_response(404, kind, title, "not found")
            if isinstance(exc, StoreError):
                return problem_response(status, kind, title, "the store is not reachable")
            return problem_response(status, kind, title, str(exc), headers=headers, **extra)
    log.error("unmapped tether error %s", type(exc).__name__)
    return problem_response(500, "internal", "Internal error", "an internal error occurred")


def install(app: FastAPI) -> None:
    async def tether_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, TetherError)
        return from_error(exc)

    async def problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(exc.status, exc.kind, exc.title, exc.detail, **exc.extra)

    async def validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            errors.append({"field": loc or "body", "message": str(e.get("msg", "invalid"))})
        malformed = any(e.get("type") == "json_invalid" for e in exc.errors())
        if malformed:
            return problem_response(
                400, "malformed-json", "Malformed JSON", "the request body is not valid JSON"
            )
        return problem_response(
            422,
            "validation",
            "Validation failed",
            "; ".join(f"{e['field']}: {e['message']}" for e in errors),
            errors=errors,
        )

    async def http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers) if exc.headers else None
        kinds = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}
        kind = kinds.get(exc.status_code, f"http-{exc.status_code}")
        detail = "not found" if exc.status_code == 404 else str(exc.detail)
        return problem_response(
            exc.status_code, kind, kind.replace("-", " ").capitalize(), detail, headers=headers
        )

    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return problem_response(500, "internal", "Internal error", "an internal error occurred")

    app.add_exception_handler(TetherError, tether_error)
    app.add_exception_handler(Problem, problem)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
