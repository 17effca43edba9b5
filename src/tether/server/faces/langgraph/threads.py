"""Threads: the caller's own sessions, never anyone else's.

``POST /threads`` makes a session (``thread_id`` optional; ``if_exists`` ``raise`` is a 409,
``do_nothing`` returns the one there); its runs use the assistant ``metadata.graph_id`` names
by default (else the app's first). A thread's ``values`` are its ``messages``; its ``status``
is ``idle``, ``busy``, ``interrupted`` (a turn waits for a human) or ``error`` (the last turn
failed). ``ttl`` is in minutes, as LangGraph's; only the ``delete`` strategy exists here.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from tether.errors import InvalidSessionId, SessionNotFound, TooLarge
from tether.records import Principal, SessionKey, SessionRecord
from tether.server.deps import State
from tether.server.faces.langgraph._common import (
    Caller,
    assistant,
    body_of,
    contains,
    number,
    own_thread,
)
from tether.server.faces.langgraph._errors import LangGraphRoute, invalid
from tether.server.faces.langgraph._state import history, thread_metadata, thread_out, thread_status
from tether.server.state import ServerState

router = APIRouter(route_class=LangGraphRoute)

_SORTS = {"thread_id", "created_at", "updated_at", "state_updated_at", "status"}
_STATUSES = {"idle", "busy", "interrupted", "error"}


def _metadata(st: ServerState, body: dict[str, Any]) -> dict[str, Any] | None:
    metadata = body.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise invalid("metadata must be an object")
    try:
        size = len(json.dumps(metadata, allow_nan=False, ensure_ascii=False).encode())
    except (ValueError, UnicodeEncodeError):
        raise invalid("metadata must be plain JSON") from None
    limit = st.settings.limits.max_metadata_bytes
    if size > limit:
        raise TooLarge(f"metadata is {size} bytes; the limit is {limit}")
    return metadata


def _ttl_seconds(body: dict[str, Any]) -> float | None:
    ttl = body.get("ttl")
    if ttl is None:
        return None
    if isinstance(ttl, dict):
        if ttl.get("strategy", "delete") != "delete":
            raise invalid("ttl.strategy: only delete is supported")
        ttl = ttl.get("ttl")
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
        raise invalid("ttl must be a positive number of minutes")
    return float(ttl) * 60


@router.post("/threads")
async def create_thread(request: Request, st: State, caller: Caller) -> JSONResponse:
    """A new thread (session) of the caller's."""
    body = await body_of(request)
    if body.get("supersteps"):
        raise invalid("supersteps are not supported: a thread's history comes from its runs")
    metadata = _metadata(st, body) or {}
    named = metadata.get("graph_id") or metadata.get("assistant_id")
    if not named and st.agents:
        named = st.agents[0].name
    agent = assistant(st, named)
    thread_id = body.get("thread_id") or str(uuid.uuid4())
    if body.get("if_exists", "raise") not in ("raise", "do_nothing"):
        raise invalid("if_exists must be raise or do_nothing")
    try:
        key = SessionKey.of(caller, thread_id)
    except InvalidSessionId:
        raise invalid("thread_id must be 1-128 characters of letters, digits and '._:-'") from None
    record, _ = await st.runtime.sessions.create(
        key,
        agent.name,
        metadata=metadata,
        ttl_seconds=_ttl_seconds(body),
        exist_ok=body.get("if_exists") == "do_nothing",
        replace_expired=True,
    )
    return JSONResponse(await thread_out(st, record))


async def _all_threads(st: ServerState, caller: Principal) -> list[SessionRecord]:
    out: list[SessionRecord] = []
    cursor: str | None = None
    while True:
        page = await st.runtime.sessions.page(caller.tenant, caller.user, limit=200, after=cursor)
        out.extend(page.records)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def _search(st: ServerState, caller: Principal, body: dict[str, Any]) -> list[SessionRecord]:
    if body.get("values"):
        raise invalid("filtering threads by values is not supported")
    metadata = body.get("metadata") or {}
    ids = body.get("ids")
    status = body.get("status")
    if not isinstance(metadata, dict):
        raise invalid("metadata must be an object")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        raise invalid("ids must be a list of thread ids")
    if status is not None and status not in _STATUSES:
        raise invalid(f"status must be one of {', '.join(sorted(_STATUSES))}")
    found = []
    for record in await _all_threads(st, caller):
        if ids is not None and record.key.session_id not in ids:
            continue
        if not contains(thread_metadata(record), metadata):
            continue
        if status is not None:
            try:
                if await thread_status(st, record.key) != status:
                    continue
            except SessionNotFound:
                continue  # deleted since the listing (a stateless run's thread, say)
        found.append(record)
    return found


@router.post("/threads/search")
async def search_threads(request: Request, st: State, caller: Caller) -> JSONResponse:
    """The caller's threads that match ``metadata``, ``ids`` and ``status``, newest first by
    default (``sort_by`` thread_id, created_at or updated_at; ``limit``, ``offset``)."""
    body = await body_of(request)
    found = await _search(st, caller, body)
    sort_by = body.get("sort_by") or "created_at"
    if sort_by not in _SORTS:
        raise invalid(f"sort_by must be one of {', '.join(sorted(_SORTS))}")
    order = body.get("sort_order") or ("asc" if sort_by == "thread_id" else "desc")
    if order not in ("asc", "desc"):
        raise invalid("sort_order must be asc or desc")
    field = {"thread_id": "session_id", "created_at": "created_at"}.get(sort_by, "updated_at")
    found.sort(
        key=lambda r: r.key.session_id if field == "session_id" else getattr(r, field),
        reverse=order == "desc",
    )
    offset, limit = number(body, "offset", 0, 10**6), number(body, "limit", 10, 1000)
    threads = []
    for record in found[offset : offset + limit]:
        try:
            threads.append(await thread_out(st, record))
        except SessionNotFound:
            # Deleted between the listing and this read: a search sees a thread or it doesn't,
            # it never fails because another request ended one.
            continue
    select = body.get("select")
    if isinstance(select, list):
        threads = [{k: v for k, v in t.items() if k in select} for t in threads]
    return JSONResponse(threads)


@router.post("/threads/count")
async def count_threads(request: Request, st: State, caller: Caller) -> JSONResponse:
    return JSONResponse(len(await _search(st, caller, await body_of(request))))


@router.get("/threads/{thread_id}")
async def get_thread(thread_id: str, st: State, caller: Caller) -> JSONResponse:
    return JSONResponse(await thread_out(st, await own_thread(st, caller, thread_id)))


@router.patch("/threads/{thread_id}")
async def update_thread(
    thread_id: str, request: Request, st: State, caller: Caller
) -> JSONResponse:
    """Merge ``metadata`` into the thread's (and set a new ``ttl``)."""
    record = await own_thread(st, caller, thread_id)
    body = await body_of(request)
    metadata = {**record.metadata, **(_metadata(st, body) or {})}
    updated = await st.runtime.sessions.update(
        record.key, metadata=metadata, ttl_seconds=_ttl_seconds(body)
    )
    return JSONResponse(await thread_out(st, updated))


@router.delete("/threads/{thread_id}", status_code=204)
async def delete_thread(thread_id: str, st: State, caller: Caller) -> Response:
    """Delete the thread with its history; a run under way is cancelled first."""
    record = await own_thread(st, caller, thread_id)
    await st.runtime.sessions.delete(record.key)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/state")
async def get_state(thread_id: str, st: State, caller: Caller) -> JSONResponse:
    """The thread's current state: its messages, and what a turn waiting for a human asks."""
    record = await own_thread(st, caller, thread_id)
    return JSONResponse((await history(st, record.key))[0])


def _before(raw: object) -> str | None:
    if raw is None or isinstance(raw, str):
        return raw or None
    if isinstance(raw, dict) and isinstance(raw.get("checkpoint_id"), str):
        return str(raw["checkpoint_id"])
    raise invalid("before must be a checkpoint id or a checkpoint")


async def _history(
    st: ServerState, caller: Principal, thread_id: str, body: dict[str, Any]
) -> JSONResponse:
    record = await own_thread(st, caller, thread_id)
    states = await history(st, record.key)
    before = _before(body.get("before"))
    if before is not None:
        ids = [s["checkpoint"]["checkpoint_id"] for s in states]
        states = states[ids.index(before) + 1 :] if before in ids else []
    metadata = body.get("metadata")
    if isinstance(metadata, dict):
        states = [s for s in states if contains(s["metadata"], metadata)]
    return JSONResponse(states[: number(body, "limit", 10, 1000)])


@router.get("/threads/{thread_id}/history")
async def get_history(
    thread_id: str, st: State, caller: Caller, limit: int = 10, before: str | None = None
) -> JSONResponse:
    """The thread's states, newest first: one after each turn (``limit``, ``before``)."""
    return await _history(st, caller, thread_id, {"limit": limit, "before": before})


@router.post("/threads/{thread_id}/history")
async def post_history(thread_id: str, request: Request, st: State, caller: Caller) -> JSONResponse:
    return await _history(st, caller, thread_id, await body_of(request))
