"""The ASGI app: ``create_app(settings, agents)`` with a lifespan that owns store and scheduler."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tether.agent import Agent
from tether.runtime import Runtime
from tether.server import problems
from tether.server.auth import Authenticator
from tether.server.faces import a2a as a2a_face
from tether.server.faces import agui as agui_face
from tether.server.faces import langgraph as langgraph_face
from tether.server.faces import mcp as mcp_face
from tether.server.faces import openai as openai_face
from tether.server.local_mode import LocalMode
from tether.server.routes import chat, console, knowledge, memory, meta, sessions, turns, users
from tether.server.settings import Settings
from tether.server.state import ServerState
from tether.server.tokens import JwtVerifier
from tether.server.turn_lane import TurnLane
from tether.store import open_store_url
from tether.version import __version__


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes (413), declared or streamed; paths matching a
    ``wider`` pattern (uploads) may send up to its own, larger bound."""

    def __init__(
        self, app: ASGIApp, limit: int, wider: Sequence[tuple[re.Pattern[str], int]] = ()
    ) -> None:
        self.app = app
        self.limit = limit
        self.wider = list(wider)

    def limit_for(self, path: str) -> int:
        for pattern, limit in self.wider:
            if pattern.fullmatch(path):
                return max(limit, self.limit)
        return self.limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bound = self.limit_for(scope.get("path", ""))
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > bound:
                await self._reject(send, bound)
                return
        seen = 0
        too_large = False
        started = False

        async def limited() -> Message:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > bound:
                    too_large = True
                    raise _TooLarge
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if too_large:
                # The app's answer to a body we cut short (FastAPI turns the error it got
                # from ``receive`` into a 400): the caller gets our 413 instead.
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, guarded)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await self._reject(send, bound)

    async def _reject(self, send: Send, bound: int) -> None:
        body = problems.problem_response(
            413,
            "too-large",
            "Payload too large",
            f"request bodies are limited to {bound} bytes",
        )
        await send({"type": "http.response.start", "status": 413, "headers": body.raw_headers})
        await send({"type": "http.response.body", "body": body.body})


class _TooLarge(Exception):
    pass


def create_app(settings: Settings | None = None, agents: Sequence[Agent] | None = None) -> FastAPI:
    settings = settings or Settings.from_env()
    if agents is None:
        agents = [default_agent(settings)]
    agents = list(agents)
    store = open_store_url(settings.store_url)
    runtime = Runtime(
        store,
        data_dir=settings.data_dir,
        agents=agents,
        lease_ttl=settings.lease_ttl,
        node=settings.node,
        max_queue=settings.limits.max_queue,
        default_model=settings.model,
        limits=settings.principal,
    )
    state = ServerState(
        settings=settings,
        runtime=runtime,
        auth=Authenticator(
            runtime.keys,
            LocalMode(
                insecure=settings.insecure,
                allowed_hosts=settings.allowed_hosts,
                allowed_origins=settings.allowed_origins,
            ),
            JwtVerifier(settings.jwt) if settings.jwt is not None else None,
        ),
        agents=agents,
    )

    mcp = mcp_face.McpFace(state) if "mcp" in settings.faces else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            # Faces with machinery of their own (the MCP SDK's task group) run inside the
            # runtime's life: they stop first, and the runtime drains after them.
            async with AsyncExitStack() as faces:
                if mcp is not None:
                    await faces.enter_async_context(mcp.running())
                yield
        finally:
            await runtime.close(drain_timeout=settings.drain_timeout)

    app = FastAPI(
        title="tether",
        version=__version__,
        summary="Many conversations with LLM agents at once, with real isolation between them.",
        lifespan=lifespan,
        # /docs and /redoc are served offline by the console's routes instead (no CDN).
        docs_url=None,
        redoc_url=None,
    )
    app.state.tether = state
    problems.install(app)
    routers = [
        meta.router,
        sessions.router,
        turns.router,
        chat.router,
        memory.router,
        knowledge.router,
        users.router,
    ]
    for router in routers:
        app.include_router(router)
    problems.document(app, [route for router in routers for route in router.routes])
    if "openai" in settings.faces:
        # Other APIs' faces document their own errors, in their own shapes (DESIGN §9).
        app.include_router(openai_face.router)
    if "a2a" in settings.faces:
        app.include_router(a2a_face.router)
    if "langgraph" in settings.faces:
        # Out of the OpenAPI document: LangGraph documents its dialect (faces/langgraph).
        app.include_router(langgraph_face.router)
    if mcp is not None:
        mcp.install(app)
    if "agui" in settings.faces:
        app.include_router(agui_face.router)
    console.install(app)
    # Added before BodyLimit, so inside it: the lane's bodies are bounded as every other's.
    app.add_middleware(TurnLane, owner=app)
    app.add_middleware(
        BodyLimit,
        limit=settings.limits.max_body_bytes,
        wider=[(knowledge.UPLOAD_PATH, knowledge.MAX_UPLOAD_BYTES)],
    )
    return app


def default_agent(settings: Settings) -> Agent:
    """What ``tether serve`` runs with no app: one assistant on the default model."""
    return Agent(
        name="assistant",
        instructions="You are a helpful assistant. Answer briefly and accurately.",
        model=settings.model,
        description="A general assistant on the default model.",
    )
