"""RFC 9457 problem details: every error the API returns has this shape and a stable ``type``.

Error bodies never carry stack traces or raw exception text from inside the server: the
``detail`` comes from tether's own error messages, written for the caller.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match

from tether.errors import (
    AgentNotFound,
    Conflict,
    DecisionMade,
    Forbidden,
    IdempotencyKeyReused,
    InvalidInput,
    LimitExceeded,
    ModelError,
    NotFound,
    QueueFull,
    RevisionConflict,
    SessionBusy,
    ShuttingDown,
    StorageQuotaExceeded,
    StoreError,
    TetherError,
    TooLarge,
    Unauthorized,
)
from tether.events import EVENT_TYPES, TURN_ENDED
from tether.server.memory_schemas import merge_scope_parameters
from tether.server.schemas import DecisionOut, ProblemOut, without_null

log = logging.getLogger("tether.server")

PROBLEM_JSON = "application/problem+json"
BASE = "https://tether.dev/problems/"


class Problem(Exception):
    """An HTTP problem raised from a route (for the few not mapped from TetherError)."""

    def __init__(
        self,
        status: int,
        kind: str,
        title: str,
        detail: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.kind = kind
        self.title = title
        self.detail = detail
        self.headers = headers
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
    (LimitExceeded, 429, "limit-exceeded", "Over a per-principal limit"),
    (IdempotencyKeyReused, 422, "idempotency-key-reused", "Idempotency key reused"),
    (SessionBusy, 409, "session-busy", "Session busy"),
    (DecisionMade, 409, "decision-made", "Decision already made"),
    (Conflict, 409, "conflict", "Conflict"),
    (StorageQuotaExceeded, 413, "storage-quota", "Storage quota exceeded"),
    (TooLarge, 413, "too-large", "Payload too large"),
    (InvalidInput, 400, "invalid-input", "Invalid input"),
    (StoreError, 503, "store-unavailable", "Store unavailable"),
    (ShuttingDown, 503, "shutting-down", "Shutting down"),
    (ModelError, 502, "model-error", "Model error"),
]


def from_error(exc: TetherError) -> JSONResponse:
    for cls, status, kind, title in _MAP:
        if isinstance(exc, cls):
            extra: dict[str, Any] = {}
            headers: dict[str, str] | None = None
            if isinstance(exc, SessionBusy):
                extra["busy_turn_id"] = exc.busy_turn_id
            if isinstance(exc, RevisionConflict):
                extra["current_revision"] = exc.current_revision
            if isinstance(exc, DecisionMade):
                # The first decision stands; the second decider learns what it was.
                extra["decision"] = DecisionOut.of(exc.decision).model_dump(mode="json")
            if isinstance(exc, Unauthorized):
                headers = {"WWW-Authenticate": "Bearer"}
            if isinstance(exc, QueueFull):
                headers = {"Retry-After": "1"}
            if isinstance(exc, LimitExceeded):
                headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
            if isinstance(exc, AgentNotFound):
                # Agent names are no secret (GET /v1/agents): say which, and which there are.
                return problem_response(404, kind, title, str(exc), agents=list(exc.known))
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
        return problem_response(
            exc.status, exc.kind, exc.title, exc.detail, headers=exc.headers, **exc.extra
        )

    async def validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
            message = str(e.get("msg", "invalid"))
            # A model's own check says its words; pydantic's prefix for them says nothing.
            message = message.removeprefix("Value error, ")
            errors.append({"field": loc or "body", "message": message})
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

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers) if exc.headers else None
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        if exc.status_code == 400:
            # FastAPI's only 400: a JSON body its parser gave up on (too deeply nested, say).
            return problem_response(
                400, "malformed-json", "Malformed JSON", "the request body is not valid JSON"
            )
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


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(request: Request) -> str:
    """Every method some route serves at the request's path, for a 405's ``Allow`` (Starlette
    names those of the first route that matched the path only: GET of ``/v1/sessions/{sid}``
    hides its PATCH and DELETE)."""
    routes = request.app.router.routes
    found = [
        method
        for method in _METHODS
        if any(r.matches({**request.scope, "method": method})[0] is Match.FULL for r in routes)
    ]
    return ", ".join(found)


# -- OpenAPI ------------------------------------------------------------------------------------
_REF = {"$ref": "#/components/schemas/Problem"}
SSE = "text/event-stream"
# Before OpenAPI 3.2, the ``schema`` of an event stream describes each of its events.
_EVENT_REF = {"$ref": "#/components/schemas/ServerSentEvent"}
_EVENT: dict[str, Any] = {
    "title": "ServerSentEvent",
    "description": "One frame of a turn's event stream (``: ping`` comments come between).",
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {
            "type": "string",
            "pattern": "^[^:]+:[0-9]+$",
            "description": "``<turn id>:<seq>``: send it back as Last-Event-ID to resume.",
        },
        "event": {
            "type": "string",
            "pattern": "^[a-z_]+[.][a-z_]+$",
            "enum": list(EVENT_TYPES),
            "description": f"{', '.join(EVENT_TYPES[:-1])} or {TURN_ENDED} (the last, exactly"
            " once).",
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {"type": "object"},
        },
    },
}
DESCRIPTIONS: dict[int, str] = {
    400: "malformed JSON, an invalid session id, or two different API keys in one request",
    401: "no credentials, or an unknown or revoked API key",
    403: "you may read this but not change it (agent and tenant memory: admins only); with no "
    "API keys, a Host other than localhost or an IP address, or a change from another origin",
    404: "unknown or not yours (indistinguishable)",
    409: "conflict",
    413: "the body, message or metadata is over its size bound",
    422: "the body, query or headers do not match the schema",
    428: "the request must say which revision it expects",
    429: "the session's queue of turns is full",
    502: "the model provider failed",
    503: "the store is unreachable",
}


def responses(*codes: int, **described: str) -> dict[int | str, dict[str, Any]]:
    """Error responses for a route decorator, e.g. ``responses(404, e409="the id is taken")``."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        out[code] = {"description": DESCRIPTIONS.get(code, "error")}
    for name, text in described.items():
        out[int(name.removeprefix("e"))] = {"description": text}
    for entry in out.values():
        entry["content"] = {PROBLEM_JSON: {"schema": _REF}}
    return out


def _uses(dependant: Dependant, names: set[str]) -> set[str]:
    """Which of the dependencies named ``names`` the route resolves, however deeply.

    By name, because ``deps`` (which defines them) imports this module through ``auth``.
    """
    found = {getattr(d.call, "__name__", "") for d in dependant.dependencies} & names
    for sub in dependant.dependencies:
        found |= _uses(sub, names)
    return found


def _implied(route: APIRoute) -> set[int]:
    """The errors every route of this shape can answer, whatever its decorator says."""
    dependant = route.dependant
    uses = _uses(dependant, {"principal", "state_of", "session_key", "own_session", "asking"})
    if "asking" in uses:  # three of them (deps.asking: the session is found by its write)
        uses |= {"principal", "state_of", "session_key"}
    codes: set[int] = set()
    if "principal" in uses:
        codes |= {400, 401, 403}  # ambiguous credentials; local mode's Host and Origin
    if "state_of" in uses:
        codes.add(503)
    if "session_key" in uses:
        codes.add(400)
    if "own_session" in uses:
        codes.add(404)
    if route.body_field is not None:
        codes |= {400, 413, 422}
    if dependant.query_params or dependant.header_params:
        codes.add(422)
    return codes


def document(app: FastAPI, api_routes: Iterable[BaseRoute]) -> None:
    """Make ``/openapi.json`` say what the API does: every error is problem+json, listed.

    FastAPI documents validation errors as its own ``HTTPValidationError`` JSON; ours are
    problems. And some errors come from the route's shape rather than its code (401 from the
    principal, 400 from a session id, 413 from the body limit): they are added here so that no
    route can forget them. ``api_routes`` are the included routers' routes (FastAPI wraps
    included routers, so ``app.routes`` does not list them).
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        routes = {
            (method.lower(), r.path): r
            for r in api_routes
            if isinstance(r, APIRoute)
            for method in r.methods or ()
        }
        for path, item in schema.get("paths", {}).items():
            for method, op in item.items():
                for parameter in op.get("parameters", []):
                    parameter["schema"] = without_null(parameter["schema"])
                merge_scope_parameters(op)
                route = routes.get((method, path))
                documented = op.setdefault("responses", {})
                implied = _implied(route) if route else set()
                if 422 not in implied and documented.get("422", {}).get("description") == (
                    "Validation Error"
                ):
                    # FastAPI adds a 422 to every route with parameters; a bare path string
                    # cannot fail validation.
                    del documented["422"]
                for code in sorted(implied):
                    documented.setdefault(str(code), {"description": DESCRIPTIONS[code]})
                for code, response in documented.items():
                    if route is None:
                        continue  # another API's face (DESIGN §9): its errors are its own
                    if code.isdigit() and int(code) >= 400:
                        response["content"] = {PROBLEM_JSON: {"schema": _REF}}
                    elif SSE in response.get("content", {}):
                        response["content"][SSE] = {"schema": _EVENT_REF}
                op["responses"] = dict(sorted(documented.items()))
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        components["Problem"] = ProblemOut.model_json_schema()
        components["ServerSentEvent"] = _EVENT
        # Either credential works; in local mode (loopback, no keys yet) neither is needed.
        schema["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "an API key"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
        schema["security"] = [{"bearer": []}, {"apiKey": []}, {}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
