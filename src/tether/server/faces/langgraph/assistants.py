"""``GET /info`` and the assistants: each of the app's agents, read-only."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from tether.server.deps import State
from tether.server.faces.langgraph._common import Caller, assistant, body_of, contains, number
from tether.server.faces.langgraph._errors import LangGraphRoute
from tether.server.faces.langgraph._wire import assistant_out
from tether.server.state import ServerState
from tether.version import __version__

router = APIRouter(route_class=LangGraphRoute)


@router.get("/info")
async def info(_: Caller) -> JSONResponse:
    """What serves this dialect: tether, and which of LangGraph's features it has."""
    return JSONResponse(
        {
            "version": __version__,
            "server": "tether",
            "flags": {"assistants": True, "crons": False, "langsmith": False, "store": False},
            "metadata": {},
        }
    )


def _matching(st: ServerState, body: dict[str, Any]) -> list[dict[str, Any]]:
    graph_id, name, metadata = body.get("graph_id"), body.get("name"), body.get("metadata")
    out = []
    for agent in st.agents:
        shown = assistant_out(agent)
        if graph_id is not None and graph_id != agent.name:
            continue
        if isinstance(name, str) and name.lower() not in agent.name.lower():
            continue
        if isinstance(metadata, dict) and not contains(shown["metadata"], metadata):
            continue
        out.append(shown)
    if body.get("sort_by") in ("assistant_id", "graph_id", "name"):
        out.sort(
            key=lambda a: str(a[str(body["sort_by"])]), reverse=body.get("sort_order") == "desc"
        )
    return out


@router.post("/assistants/search")
async def search_assistants(request: Request, st: State, _: Caller) -> JSONResponse:
    """The assistants that match ``graph_id``, ``name`` (contained) and ``metadata``."""
    body = await body_of(request)
    found = _matching(st, body)
    offset, limit = number(body, "offset", 0, 10**6), number(body, "limit", 10, 1000)
    page = found[offset : offset + limit]
    select = body.get("select")
    if isinstance(select, list):
        page = [{k: v for k, v in a.items() if k in select} for a in page]
    headers = {"X-Pagination-Next": str(offset + limit)} if offset + limit < len(found) else None
    return JSONResponse(page, headers=headers)


@router.post("/assistants/count")
async def count_assistants(request: Request, st: State, _: Caller) -> JSONResponse:
    return JSONResponse(len(_matching(st, await body_of(request))))


@router.get("/assistants/{assistant_id}")
async def get_assistant(assistant_id: str, st: State, _: Caller) -> JSONResponse:
    """An assistant by its id: the agent's name."""
    return JSONResponse(assistant_out(assistant(st, assistant_id)))
