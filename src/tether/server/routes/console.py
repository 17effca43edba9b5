"""The web console at ``/`` and the API docs at ``/docs`` and ``/redoc``, all served from files
in packages: nothing is fetched from a CDN, so both work on a machine with no network.

The console is plain ES modules, a stylesheet and one HTML page (``tether/server/console/``):
no build step. It talks to the public HTTP API with the user's own credentials, so it shows
exactly what that user may see; its files themselves are public, like ``/openapi.json``.
Its assets live under ``/console/``, a prefix no API route uses, and the page routes by the
URL's fragment (``#/sessions/<id>``), so the server needs no catch-all route.

Swagger UI and ReDoc come from the ``fastapi-offline`` wheel's static files, served under
``/console/vendor/``.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CONSOLE_DIR = Path(__file__).resolve().parent.parent / "console"
VENDOR_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS = "/console"
VENDOR = "/console/vendor"

# The console loads nothing but its own files and talks to nothing but this server. Framing is
# refused: in local mode whoever can click the page acts as ``local``, so no other site may put
# it in a frame and steer the clicks.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
# Swagger UI and ReDoc run inline scripts and styles (FastAPI's pages) and ReDoc starts a
# worker from a blob: still nothing from elsewhere.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; "
    "frame-ancestors 'none'"
)


def _secured(response: Response, policy: str) -> Response:
    response.headers["Content-Security-Policy"] = policy
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


class _Headers:
    """Adds the console's security headers to every answer of a static mount."""

    def __init__(self, app: ASGIApp, policy: str) -> None:
        self.app = app
        self.policy = policy.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", self.policy),
                    (b"x-content-type-options", b"nosniff"),
                    # Revalidated on every load: a new tether release is seen at once.
                    (b"cache-control", b"no-cache"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI) -> None:
    """Serve the console at ``/`` (its assets under ``/console/``) and the docs offline.

    The app must be made with ``docs_url=None, redoc_url=None``: these routes replace FastAPI's,
    which load their scripts from a CDN.
    """
    # The vendor mount first: a mount matches its whole prefix, and /console would take it.
    app.mount(VENDOR, _Headers(StaticFiles(directory=VENDOR_DIR), DOCS_CSP), name="vendor")
    app.mount(ASSETS, _Headers(StaticFiles(directory=CONSOLE_DIR), CONSOLE_CSP), name="console")
    title = app.title

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def console() -> Response:
        response = FileResponse(CONSOLE_DIR / "index.html", media_type="text/html")
        response.headers["Cache-Control"] = "no-cache"
        return _secured(response, CONSOLE_CSP)

    @app.api_route("/docs", methods=["GET", "HEAD"], include_in_schema=False)
    async def swagger() -> HTMLResponse:
        html = get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} — API",
            swagger_js_url=f"{VENDOR}/swagger-ui-bundle.js",
            swagger_css_url=f"{VENDOR}/swagger-ui.css",
            swagger_favicon_url=f"{VENDOR}/favicon.png",
            oauth2_redirect_url=None,
            # Swagger UI would otherwise show a badge fetched from an online validator.
            swagger_ui_parameters={"validatorUrl": None},
        )
        return _docs(html)

    @app.api_route("/redoc", methods=["GET", "HEAD"], include_in_schema=False)
    async def redoc() -> HTMLResponse:
        html = get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} — API",
            redoc_js_url=f"{VENDOR}/redoc.standalone.js",
            redoc_favicon_url=f"{VENDOR}/favicon.png",
            with_google_fonts=False,
        )
        return _docs(html)


def _docs(html: HTMLResponse) -> HTMLResponse:
    _secured(html, DOCS_CSP)
    return html
