"""Sessions and their history: always the caller's own, never anyone else's."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from tether.errors import AgentNotFound, InvalidInput, TooLarge
from tether.records import SessionKey, new_session_id
from tether.server.deps import Caller, Key, OwnSession, State
from tether.server.schemas import (
    ItemOut,
    ItemPage,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionPatch,
)
from tether.server.state import ServerState

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "unknown or not yours (indistinguishable)"}
}


def _check_metadata(st: ServerState, metadata: dict[str, object] | None) -> None:
    if metadata is None:
        return
    size = len(json.dumps(metadata))
    if size > st.settings.limits.max_metadata_bytes:
        raise TooLarge(
            f"metadata is {size} bytes; the limit is {st.settings.limits.max_metadata_bytes}"
        )


async def _detailed(st: ServerState, key: SessionKey) -> SessionOut:
    record = await st.runtime.store.get_session(key)
    assert record is not None
    stats = await st.runtime.store.session_stats(key)
    return SessionOut.of(
        record,
        status="busy" if stats.active_turns else "idle",
        item_count=stats.items,
        turn_count=stats.turns,
    )


@router.post("", status_code=201, responses={409: {"description": "the id is taken"}})
async def create_session(body: SessionCreate, st: State, caller: Caller) -> SessionOut:
    """Create a session for one of the server's agents (default: the first)."""
    if not st.agents:
        raise InvalidInput("this server has no agents")
    agent = body.agent or st.agents[0].name
    if agent not in st.runtime.agents:
        raise AgentNotFound(f"no agent named {agent!r}")
    _check_metadata(st, body.metadata)
    key = SessionKey.of(caller, body.session_id or new_session_id())
    record, _ = await st.runtime.store.create_session(
        key, agent, metadata=body.metadata, ttl_seconds=body.ttl_seconds
    )
    return SessionOut.of(record, status="idle", item_count=0, turn_count=0)


@router.get("")
async def list_sessions(
    st: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
) -> SessionPage:
    """The caller's sessions, by id; pass ``next_cursor`` back as ``cursor`` for the next page."""
    records = await st.runtime.store.list_sessions(
        caller.tenant, caller.user, limit=limit + 1, after=cursor
    )
    page = records[:limit]
    more = len(records) > limit
    return SessionPage(
        data=[SessionOut.of(r) for r in page],
        next_cursor=page[-1].key.session_id if more and page else None,
    )


@router.get("/{sid}", responses=NOT_FOUND)
async def get_session(st: State, key: Key, _: OwnSession) -> SessionOut:
    """One session with its status (idle or busy) and counts."""
    return await _detailed(st, key)


@router.patch("/{sid}", responses={**NOT_FOUND, 409: {"description": "revision moved"}})
async def patch_session(body: SessionPatch, st: State, key: Key, _: OwnSession) -> SessionOut:
    """Replace metadata and/or state, or extend the TTL; ``expected_revision`` guards races."""
    _check_metadata(st, body.metadata)
    _check_metadata(st, body.state)
    await st.runtime.store.update_session(
        key,
        metadata=body.metadata,
        state=body.state,
        ttl_seconds=body.ttl_seconds,
        expected_revision=body.expected_revision,
    )
    return await _detailed(st, key)


@router.delete("/{sid}", status_code=204, responses=NOT_FOUND)
async def delete_session(st: State, key: Key, _: OwnSession) -> Response:
    """Delete the session with its history; a running turn is cancelled first."""
    for turn in await st.runtime.store.active_turns(key):
        await st.runtime.scheduler.cancel(key, turn.id, "session_deleted")
    await st.runtime.store.delete_session(key)
    return Response(status_code=204)


@router.get("/{sid}/items", responses=NOT_FOUND)
async def list_items(
    st: State,
    key: Key,
    _: OwnSession,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0)] = None,
) -> ItemPage:
    """History in order; pass ``next_cursor`` back as ``cursor`` for the next page."""
    items = await st.runtime.store.list_items(key, after_seq=cursor or 0, limit=limit + 1)
    page = items[:limit]
    return ItemPage(
        data=[ItemOut.of(i) for i in page],
        next_cursor=str(page[-1].seq) if len(items) > limit and page else None,
    )


@router.delete(
    "/{sid}/items",
    status_code=204,
    responses={**NOT_FOUND, 409: {"description": "a turn is active"}},
)
async def clear_items(st: State, key: Key, _: OwnSession) -> Response:
    """Clear the history (summaries included); refused while a turn is queued or running."""
    await st.runtime.store.clear_items(key)
    return Response(status_code=204)
