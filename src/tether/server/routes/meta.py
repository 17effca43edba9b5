"""Health, readiness and the agent list."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from tether.errors import StoreError
from tether.models.base import Model
from tether.server.deps import Caller, State
from tether.server.problems import responses
from tether.server.schemas import AgentList, AgentOut, Health

router = APIRouter()

READY_WITHIN = 5.0
"""A backstop for any backend: each store's ping has a shorter deadline of its own."""


# HEAD too, as load balancers' and uptime checkers' probes send it (not in the schema: the
# same operation as the GET, without a body).
@router.head("/healthz", include_in_schema=False)
@router.get("/healthz", tags=["health"], response_model_exclude_none=True)
async def healthz(st: State) -> Health:
    """Liveness: the process answers (whatever state its store is in: see ``/readyz``), and
    which one it is (its node name, if it has one: behind a balancer or with workers)."""
    return Health(status="ok", node=st.settings.node)


@router.head("/readyz", include_in_schema=False)
@router.get("/readyz", tags=["health"], responses=responses(503), response_model_exclude_none=True)
async def readyz(st: State) -> Health:
    """Readiness: the store can take a write now. 503, within a bound, when it cannot (a full
    disk, a store that does not answer)."""
    try:
        async with asyncio.timeout(READY_WITHIN):
            await st.runtime.ping()
    except TimeoutError as exc:
        raise StoreError(f"no answer from the store within {READY_WITHIN} s") from exc
    return Health(status="ok", node=st.settings.node)


def _model_label(model: str | Model | None, default: str) -> str:
    if model is None:
        return default
    return model if isinstance(model, str) else model.name


@router.get("/v1/agents", tags=["agents"])
async def list_agents(st: State, caller: Caller) -> AgentList:
    """The agents this server runs."""
    default = st.settings.model or "local"
    return AgentList(
        data=[
            AgentOut(
                name=a.name,
                description=a.description,
                model=_model_label(a.model, default),
                tools=[t.name for t in a.tools],
                handoffs=[h.agent_name for h in a.handoffs],
                ask_user=a.ask_user,
            )
            for a in st.agents
        ]
    )
