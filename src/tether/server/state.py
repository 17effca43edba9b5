"""What the app's routes share: settings, the runtime and authentication."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from tether.agent import Agent
from tether.runtime import Runtime
from tether.server.auth import Authenticator
from tether.server.quotas import Quotas
from tether.server.settings import Settings


@dataclass
class ServerState:
    settings: Settings
    runtime: Runtime
    auth: Authenticator
    agents: list[Agent]
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    quotas: Quotas = field(init=False)
    """Per-user storage and ingestion bounds, from ``settings.limits``."""

    def __post_init__(self) -> None:
        self.quotas = Quotas(self.runtime.memory, self.settings.limits)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` detached from the request (kept referenced until it finishes)."""
        task = asyncio.ensure_future(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


async def state_of(request: Request) -> ServerState:
    # async although it does no I/O: FastAPI runs sync dependencies in a worker thread.
    st: ServerState = request.app.state.tether
    return st
