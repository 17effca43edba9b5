"""Errors in LangGraph's own form, ``{"detail": <message>, "code": <stable code>}``.

LangGraph's servers answer ``{"detail": …}``; ``code`` is tether's stable reason (the SDK keeps
it as ``APIError.code``). Every route of the face runs under :class:`LangGraphRoute`, which
restates tether's errors (and FastAPI's validation errors) in this form, keeping the status and
the headers that matter (``WWW-Authenticate``, ``Retry-After``). A foreign thread and an unknown
one get the same 404.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tether.errors import TetherError
from tether.server.problems import Problem, from_error, problem_response


class LangGraphError(Exception):
    """A request the face refuses in its own words."""

    def __init__(self, status: int, detail: str, code: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = code
        self.headers = headers


def not_found(what: str, ident: str) -> LangGraphError:
    # The id is the caller's own words; whether someone else has one like it is not said.
    return LangGraphError(404, f"{what} {ident!r} not found", f"{what}_not_found")


def invalid(detail: str) -> LangGraphError:
    return LangGraphError(422, detail, "invalid_request")


def error_response(
    status: int, detail: str, code: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code}, status_code=status, headers=headers)


def restate(problem: JSONResponse) -> JSONResponse:
    """A tether problem+json answer in LangGraph's form: same status, words and headers."""
    body = json.loads(bytes(problem.body))
    code = str(body.get("type", "")).rsplit("/", 1)[-1].replace("-", "_") or "error"
    detail = str(body.get("detail") or body.get("title") or "error")
    kept = {
        k: v for k, v in problem.headers.items() if k.lower() in ("www-authenticate", "retry-after")
    }
    return error_response(problem.status_code, detail, code, kept or None)


def response_of(exc: Exception) -> JSONResponse:
    if isinstance(exc, LangGraphError):
        return error_response(exc.status, exc.detail, exc.code, exc.headers)
    if isinstance(exc, TetherError):
        return restate(from_error(exc))
    if isinstance(exc, Problem):
        return restate(
            problem_response(
                exc.status, exc.kind, exc.title, exc.detail, headers=exc.headers, **exc.extra
            )
        )
    assert isinstance(exc, RequestValidationError)
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return error_response(422, "; ".join(parts) or "invalid request", "invalid_request")


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class LangGraphRoute(APIRoute):
    """A route whose errors come out in LangGraph's form (see the module's docstring)."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except (LangGraphError, TetherError, Problem, RequestValidationError) as exc:
                return response_of(exc)

        return guarded
