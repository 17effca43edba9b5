"""Memory items: the caller's own session and user memory, and the tenant's shared agent and
tenant memory (everyone reads it, admins write it).

Every namespace is built from the caller's principal, never from the request: a ``session_id``
names a session of the caller's own, and an item id of someone else's memory answers the same
404 as an id that does not exist.
"""

from __future__ import annotations

import contextlib
import re
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response

from tether.errors import InvalidInput, MemoryNotFound, RevisionConflict
from tether.records import SCOPES, MemoryRecord, Principal, SessionKey
from tether.server.deps import Caller, State
from tether.server.memory_schemas import (
    AGENT_DOC,
    SESSION_ID_DOC,
    Cleared,
    MemoryCreate,
    MemoryHits,
    MemoryOut,
    MemoryPage,
    MemoryPatch,
    MemorySearch,
    ScopeName,
)
from tether.server.problems import Problem, responses
from tether.server.schemas import minted
from tether.server.state import ServerState

router = APIRouter(prefix="/v1/memory", tags=["memory"])

MAX_SEQ = 2**63 - 1
"""Cursors are sequence numbers, stored as 64-bit integers."""

SessionIdQuery = Annotated[
    str | None,
    Query(
        description="A session of yours: required for session scope.",
        json_schema_extra=SESSION_ID_DOC,
    ),
]
AgentQuery = Annotated[
    str | None,
    Query(
        max_length=128,
        description="An agent name: required for agent scope.",
        json_schema_extra=AGENT_DOC,
    ),
]
MemoryIdPath = Annotated[str, Path(description="A memory item id (``mem_…``).")]

FORBIDDEN = "only admins may write agent or tenant memory"
NOT_FOUND_TARGET = "the session (or, for agent scope, the agent) is unknown or not yours"


# -- shared with the knowledge routes ----------------------------------------------------------
def check_agent(agent: str | None) -> str | None:
    """An agent name as the API takes it: 1-128 characters, none of them control characters
    (namespaces are keyed by a control character)."""
    if agent is None:
        return None
    if not 1 <= len(agent) <= 128 or any(ord(ch) < 32 or ord(ch) == 127 for ch in agent):
        raise InvalidInput("an agent name is 1-128 characters, no control characters")
    return agent


async def check_target(
    st: ServerState,
    caller: Principal,
    *,
    session_id: str | None,
    agent: str | None,
    scope: str | None = None,
    write: bool = False,
) -> None:
    """Refuse what the memory service would take as given: a ``session_id`` must name a live
    session of the caller's (whatever the scope: it is recorded as provenance), and a write to
    agent memory must name one of the server's agents."""
    check_agent(agent)
    if session_id is not None:
        await st.runtime.sessions.own(SessionKey.of(caller, session_id))
    if write and scope == "agent" and agent is not None:
        st.runtime.served(agent)


# -- routes ------------------------------------------------------------------------------------
def _etag(response: Response, revision: int) -> None:
    response.headers["ETag"] = f'"{revision}"'


IF_MATCH = r'^[ \t]*(W/)?("[0-9]{1,18}"|[0-9]{1,18})[ \t]*$'
"""``3``, ``"3"`` or ``W/"3"``: the item's revision is its entity tag."""


def _if_match(value: str) -> int:
    """``If-Match: 3``, ``"3"`` or ``W/"3"`` → 3 (ASCII digits: ``"²".isdigit()`` is true)."""
    match = re.fullmatch(IF_MATCH, value)
    if match is None:
        raise InvalidInput('If-Match must carry the item\'s revision, e.g. If-Match: "3"')
    return int(match[2].strip('"'))


@router.get("", responses=responses(400, 404))
async def list_memory(
    st: State,
    caller: Caller,
    scope: Annotated[ScopeName, Query(description="Whose memory (default: yours).")] = "user",
    session_id: SessionIdQuery = None,
    agent: AgentQuery = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
) -> MemoryPage:
    """Memory items of one scope, oldest first; pass ``next_cursor`` back as ``cursor``."""
    await check_target(st, caller, session_id=session_id, agent=agent)
    records = await st.runtime.memory.list_items(
        caller, scope, session_id=session_id, agent=agent, after=cursor or 0, limit=limit + 1
    )
    page = records[:limit]
    return MemoryPage(
        data=[MemoryOut.of(r) for r in page],
        next_cursor=str(page[-1].seq) if len(records) > limit and page else None,
    )


@router.post(
    "",
    status_code=201,
    responses=responses(
        e403=FORBIDDEN,
        e404=NOT_FOUND_TARGET,
        e413="the content is over 8,000 characters, or past your storage quota (storage-quota)",
    ),
)
async def create_memory(
    body: MemoryCreate, st: State, caller: Caller, response: Response
) -> MemoryOut:
    """Remember something: in your user memory (default), a session of yours, or (admins) an
    agent's or the tenant's shared memory."""
    await check_target(
        st, caller, session_id=body.session_id, agent=body.agent, scope=body.scope, write=True
    )
    # Admitted by its text: the embedding (a fixed size per item) is counted once stored.
    async with st.quotas.reserve(caller, len(body.content.encode())):
        record = await st.runtime.memory.add(
            caller,
            body.content,
            scope=body.scope,
            kind=body.kind,
            session_id=body.session_id,
            agent=body.agent,
        )
    response.headers["Location"] = f"/v1/memory/{record.id}"
    _etag(response, record.revision)
    return MemoryOut.of(record)


@router.delete("", responses=responses(400, e403=FORBIDDEN, e404=NOT_FOUND_TARGET))
async def clear_memory(
    st: State,
    caller: Caller,
    scope: Annotated[ScopeName, Query(description="The scope to clear (required).")],
    session_id: SessionIdQuery = None,
    agent: AgentQuery = None,
) -> Cleared:
    """Delete every memory item of one scope (knowledge documents stay)."""
    await check_target(st, caller, session_id=session_id, agent=agent)
    deleted = await st.runtime.memory.clear(caller, scope, session_id=session_id, agent=agent)
    return Cleared(deleted=deleted)


@router.post("/search", responses=responses(404))
async def search_memory(body: MemorySearch, st: State, caller: Caller) -> MemoryHits:
    """Hybrid (lexical + embedding) search of the memory you may read, best first."""
    await check_target(st, caller, session_id=body.session_id, agent=body.agent)
    hits = await st.runtime.memory.search_for(
        caller,
        body.query,
        scopes=body.scopes or SCOPES,
        session_id=body.session_id,
        agent=body.agent,
        limit=body.limit,
    )
    return MemoryHits.of(hits)


async def _get(st: ServerState, caller: Principal, item_id: str) -> MemoryRecord:
    if not minted(item_id):
        raise MemoryNotFound("memory item not found")
    return await st.runtime.memory.get(caller, item_id)


@router.get("/{item_id}", responses=responses(404))
async def get_memory(
    item_id: MemoryIdPath, st: State, caller: Caller, response: Response
) -> MemoryOut:
    """One memory item; its ``ETag`` is its revision."""
    record = await _get(st, caller, item_id)
    _etag(response, record.revision)
    return MemoryOut.of(record)


@router.patch(
    "/{item_id}",
    responses=responses(
        400,
        404,
        e403=FORBIDDEN,
        e409="the item's revision is not the expected one, or expected_revision and If-Match"
        " disagree (current_revision says what it is)",
        e428="neither expected_revision nor If-Match says which revision you read",
    ),
)
async def patch_memory(
    item_id: MemoryIdPath,
    body: MemoryPatch,
    st: State,
    caller: Caller,
    response: Response,
    if_match: Annotated[
        str | None,
        Header(
            max_length=64,
            description="The expected revision, instead of the body's.",
            json_schema_extra={"pattern": IF_MATCH},
        ),
    ] = None,
) -> MemoryOut:
    """Rewrite an item if nobody changed it since you read it: ``expected_revision`` (or
    ``If-Match``) must be its current revision, else 409 with ``current_revision``."""
    expected: set[int] = set()
    if body.expected_revision is not None:
        expected.add(body.expected_revision)
    if if_match is not None:
        expected.add(_if_match(if_match))
    if not expected:
        # A rule across body and header, which no schema states: HTTP's own status for it.
        raise Problem(
            428,
            "precondition-required",
            "Precondition required",
            "expected_revision (or an If-Match header) is required",
        )
    if not minted(item_id):
        raise MemoryNotFound("memory item not found")
    current = await st.runtime.memory.get(caller, item_id)
    if len(expected) > 1:
        # Two preconditions that disagree: at most one is the current revision, so the write
        # fails as any stale one does.
        raise RevisionConflict(
            f"expected_revision and If-Match disagree; the revision is {current.revision}",
            current_revision=current.revision,
        )
    growth = len(body.content.encode()) - len(current.content.encode())
    # A rewrite that does not grow the item always fits, even for a user past the bound.
    room = st.quotas.reserve(caller, growth) if growth > 0 else contextlib.nullcontext()
    async with room:
        record = await st.runtime.memory.update(
            caller, item_id, content=body.content, expected_revision=expected.pop(), kind=body.kind
        )
    _etag(response, record.revision)
    return MemoryOut.of(record)


@router.delete("/{item_id}", status_code=204, responses=responses(404, e403=FORBIDDEN))
async def delete_memory(item_id: MemoryIdPath, st: State, caller: Caller) -> Response:
    """Forget one item."""
    if not minted(item_id):
        raise MemoryNotFound("memory item not found")
    await st.runtime.memory.delete(caller, item_id)
    return Response(status_code=204)
