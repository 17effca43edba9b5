"""The turn route's own lane past FastAPI's request machinery.

``POST /v1/sessions/{sid}/turns`` is the request a busy server answers most. FastAPI spends
on each one more than tether's scheduler does: its exception and exit-stack middleware, a walk
over every face's routers, the dependency solver, the body's parameter machinery. Served from
here instead, a turn at 64 sessions cost ~0.25 ms less CPU on the event loop (1.1 instead of
1.35 ms; bench/README.md), which a process bound by one core turns into turns a second.

The lane serves only what it reads exactly as FastAPI reads it, and hands everything else to
the app untouched, the body it read included:

* a POST to that path (no ``root_path``, no trailing slash), with a JSON ``Content-Type``;
* no ``Idempotency-Key`` header (FastAPI checks it; the body's field is checked here, by the
  model);
* not traced by FastAPI's own telemetry (the route names the span and records its parts);
* a body of at most 64 brackets that ``json.loads`` reads (Starlette's ``request.json``) and
  that validates as :class:`~tether.server.schemas.TurnCreate`. The bound is on nesting: how
  deep ``json.loads`` may go depends on how deep the stack already is (Python's recursion
  limit counts its scanner), and the route parses a dozen frames further down, so a body
  nested ~960 deep was read here and refused there. A turn's fields are all scalars.

From there it does what the route does, with the route's own code: the caller and session key
from :func:`~tether.server.deps.asking`, the answer from
:func:`~tether.server.routes.turns.answer_turn`. An error raised there becomes the response
the app's exception handlers make of it (the same problem+json); an error they do not handle
goes up to Starlette's, as from a route. The route stays registered (OpenAPI documents it) and
answers every request the lane passes on.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.server.deps import asking
from tether.server.routes.turns import answer_turn
from tether.server.schemas import TurnCreate

PATH = re.compile(r"/v1/sessions/([^/]+)/turns")
MAX_BRACKETS = 64
"""A body with more ``[`` and ``{`` (in its strings too) goes to the route: see above."""


class TurnLane:
    """ASGI middleware: the plain turn requests served here, the rest passed to ``app``.
    ``owner`` is the FastAPI app, whose exception handlers answer the lane's errors."""

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app = app
        # Copied as Starlette copies them when it builds the middleware stack (which makes
        # this lane too): a handler added later reaches neither.
        self.handlers: dict[Any, Any] = dict(owner.exception_handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sid = _lane_session(scope)
        if sid is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            raw = await request.body()
        except Exception as exc:
            # A body cut short (the client went away, or BodyLimit's bound): the route meets
            # the same failure where it reads the body, and answers it as it does.
            await self.app(scope, _replay(receive, error=exc), send)
            return
        body = _turn_create(raw)
        if body is None:
            await self.app(scope, _replay(receive, body=raw), send)
            return
        try:
            response = await answer_turn(await asking(request, sid), request, body, None)
        except Exception as exc:
            response = await self._handled(request, exc)
        await response(scope, receive, send)

    async def _handled(self, request: Request, exc: Exception) -> Response:
        """The response the app's handler for ``exc`` makes (as Starlette's
        ExceptionMiddleware looks it up, by class); ``exc`` itself when none does, for the
        server-error handler above."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                break  # Starlette's ServerErrorMiddleware answers those
            handler = self.handlers.get(cls)
            if handler is not None:
                if inspect.iscoroutinefunction(handler):
                    response = await handler(request, exc)
                else:  # as Starlette runs a plain function: off the event loop
                    response = await run_in_threadpool(handler, request, exc)
                assert isinstance(response, Response)
                return response
        raise exc


def _lane_session(scope: Scope) -> str | None:
    """The session id of a request the lane may serve; None for any other."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    if scope.get("fastapi.telemetry") is not None:
        return None
    match = PATH.fullmatch(scope["path"])
    if match is None:
        return None
    content_type: bytes | None = None
    for name, value in scope["headers"]:
        if name == b"idempotency-key":
            return None
        if name == b"content-type" and content_type is None:
            content_type = value  # the first, as Starlette's Headers.get reads it
    if content_type is None:
        return None
    if content_type.split(b";", 1)[0].strip().lower() != b"application/json":
        return None
    return match.group(1)


def _turn_create(raw: bytes) -> TurnCreate | None:
    """The body as the route reads it (``json.loads``, then the model from the Python value);
    None when the route would refuse it (it says why)."""
    if raw.count(b"[") + raw.count(b"{") > MAX_BRACKETS:
        return None
    try:
        return TurnCreate.model_validate(json.loads(raw))
    except Exception:  # not JSON, too deeply nested, not a valid turn: the route says which
        return None


def _replay(receive: Receive, *, body: bytes = b"", error: Exception | None = None) -> Receive:
    """``receive`` for the app, as if the lane had read nothing: first the body the lane read
    (or the error reading it met), then whatever comes next (a disconnect)."""
    pending = True

    async def again() -> Message:
        nonlocal pending
        if pending:
            pending = False
            if error is not None:
                raise error
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
