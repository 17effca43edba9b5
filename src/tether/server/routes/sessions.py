"""Sessions and their history: always the caller's own, never anyone else's."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response

from tether.errors import Conflict, InvalidInput, SessionNotFound, TooLarge
from tether.records import SessionKey, SessionOrder, SessionRecord, new_session_id
from tether.server.deps import Caller, Key, OwnSession, State
from tether.server.problems import responses
from tether.server.schemas import (
    DecisionList,
    DecisionOut,
    ItemOut,
    ItemPage,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionPatch,
)
from tether.server.state import ServerState

# A session id, after a page of ids; ``<updated_at>|<session id>`` after a page of the newest
# (rules.newest_cursor: a timestamp's repr is digits and a point).
CURSOR = r"^(?:[0-9]{1,17}(?:\.[0-9]{1,17})?\|)?[A-Za-z0-9._:-]{1,128}$"

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

NOT_FOUND = responses(404)
MAX_SEQ = 2**63 - 1
"""Cursors are sequence numbers, stored as 64-bit integers."""


MAX_DEPTH = 32
"""How deeply metadata and state may nest (JSON encoders, ours and clients', have limits)."""


def _depth(value: object) -> int:
    deepest, level = 0, [value]
    while level:
        deepest += 1
        level = [
            child
            for v in level
            if isinstance(v, dict | list)
            for child in (v.values() if isinstance(v, dict) else v)
        ]
    return deepest


def _check_metadata(st: ServerState, what: str, value: dict[str, Any] | None) -> None:
    """Plain JSON (Python's parser lets NaN, Infinity and lone surrogates through), not too
    deep, within the size bound."""
    if value is None:
        return
    if _depth(value) > MAX_DEPTH:
        raise InvalidInput(f"{what} nests deeper than {MAX_DEPTH} levels")
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        # A "\ud800" escape parses to a lone surrogate: text no store can encode (UTF-8).
        size = len(text.encode())
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} must be valid Unicode (no lone surrogates)") from None
    except ValueError:
        raise InvalidInput(f"{what} must be plain JSON (no NaN or Infinity)") from None
    limit = st.settings.limits.max_metadata_bytes
    if size > limit:
        raise TooLarge(f"{what} is {size} bytes; the limit is {limit}")


async def _detailed(st: ServerState, record: SessionRecord) -> SessionOut:
    stats = await st.runtime.sessions.stats(record.key)
    return SessionOut.of(
        record,
        status=stats.status,
        item_count=stats.items,
        turn_count=stats.turns,
        agents=list(stats.agents),
    )


@router.post(
    "",
    status_code=201,
    responses=responses(e404="no such agent", e409="you already have a session with this id"),
)
async def create_session(body: SessionCreate, st: State, caller: Caller) -> SessionOut:
    """Create a session for one of the server's agents (default: the first)."""
    if not st.agents:
        raise InvalidInput("this server has no agents")
    # An empty id is a bad id, not a request for a new one: ids are never silently rewritten.
    key = SessionKey.of(caller, new_session_id() if body.session_id is None else body.session_id)
    agent = st.runtime.served(body.agent or st.agents[0].name).name
    _check_metadata(st, "metadata", body.metadata)
    record, _ = await st.runtime.sessions.create(
        key, agent, metadata=body.metadata, ttl_seconds=body.ttl_seconds, replace_expired=True
    )
    return SessionOut.of(record, status="idle", item_count=0, turn_count=0, agents=[])


@router.get("")
async def list_sessions(
    st: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[
        str | None,
        Query(
            max_length=160,
            pattern=CURSOR,
            description="next_cursor of the previous page (of the same order)",
        ),
    ] = None,
    order: Annotated[
        SessionOrder, Query(description="id (default), or newest: the most recently active first")
    ] = "id",
    q: Annotated[
        str | None, Query(min_length=1, max_length=128, description="ids containing this text")
    ] = None,
) -> SessionPage:
    """The caller's sessions, each with its status (idle, busy or awaiting_input), counts and
    agents; pass ``next_cursor`` back as ``cursor`` for the next page.

    Expired sessions are left out (they answer 404), so a page may hold fewer than ``limit``.
    """
    page = await st.runtime.sessions.page(
        caller.tenant, caller.user, limit=limit, after=cursor, order=order, contains=q
    )
    data = []
    for record in page.records:
        try:
            data.append(await _detailed(st, record))
        except SessionNotFound:
            continue  # deleted since the page was read: left out, never a 404 for the list
    return SessionPage(data=data, next_cursor=page.next_cursor)


@router.get("/{sid}", responses=NOT_FOUND)
async def get_session(st: State, record: OwnSession) -> SessionOut:
    """One session with its status (idle or busy) and counts."""
    return await _detailed(st, record)


@router.patch(
    "/{sid}", responses=responses(404, e409="expected_revision is not the current revision")
)
async def patch_session(body: SessionPatch, st: State, key: Key, _: OwnSession) -> SessionOut:
    """Replace metadata and/or state, or extend the TTL; ``expected_revision`` guards races."""
    _check_metadata(st, "metadata", body.metadata)
    _check_metadata(st, "state", body.state)
    if body.metadata is None and body.state is None and body.ttl_seconds is None:
        # Nothing to change: nothing written, no new revision (a bump would fail every other
        # client's expected_revision for a change that never was).
        record = await st.runtime.sessions.own(key)
        wanted = body.expected_revision
        if wanted is not None and record.revision != wanted:
            raise Conflict(f"session revision is {record.revision}, not {wanted}")
        return await _detailed(st, record)
    record = await st.runtime.sessions.update(
        key,
        metadata=body.metadata,
        state=body.state,
        ttl_seconds=body.ttl_seconds,
        expected_revision=body.expected_revision,
    )
    return await _detailed(st, record)


@router.delete("/{sid}", status_code=204, responses=NOT_FOUND)
async def delete_session(st: State, key: Key, _: OwnSession) -> Response:
    """Delete the session with its history; a running turn is cancelled first."""
    await st.runtime.sessions.delete(key)
    return Response(status_code=204)


@router.get("/{sid}/items", responses=NOT_FOUND)
async def list_items(
    st: State,
    key: Key,
    _: OwnSession,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
) -> ItemPage:
    """History in order; pass ``next_cursor`` back as ``cursor`` for the next page."""
    items = await st.runtime.sessions.items(key, after=cursor or 0, limit=limit + 1)
    page = items[:limit]
    return ItemPage(
        data=[ItemOut.of(i) for i in page],
        next_cursor=str(page[-1].seq) if len(items) > limit and page else None,
    )


@router.delete(
    "/{sid}/items",
    status_code=204,
    responses=responses(404, e409="a turn is queued or running (busy_turn_id names it)"),
)
async def clear_items(
    st: State,
    key: Key,
    _: OwnSession,
    workspace: Annotated[
        bool, Query(description="also delete the session's workspace files")
    ] = False,
) -> Response:
    """Clear the history (summaries included); refused while a turn is queued or running.
    ``workspace=true`` deletes the session's workspace files too."""
    await st.runtime.sessions.clear(key, workspace=workspace)
    return Response(status_code=204)


@router.get("/{sid}/decisions", responses=NOT_FOUND)
async def list_decisions(
    st: State,
    key: Key,
    _: OwnSession,
    status: Annotated[
        Literal["pending", "approved", "denied", "always", "answered", "expired", "cancelled"]
        | None,
        Query(description="Only decisions in this status (pending: what waits for you now)."),
    ] = None,
) -> DecisionList:
    """The session's decisions (tool approvals, questions), oldest first."""
    found = await st.runtime.scheduler.decisions(key, status=status)
    return DecisionList(decisions=[DecisionOut.of(d) for d in found])
