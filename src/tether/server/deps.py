"""Route dependencies: the principal first, then the caller's own session."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Path, Request

from tether.errors import SessionNotFound, TooLarge
from tether.records import Principal, SessionKey, SessionRecord
from tether.server.schemas import SESSION_ID
from tether.server.state import ServerState, state_of

State = Annotated[ServerState, Depends(state_of)]


async def principal(request: Request, st: State) -> Principal:
    return await st.auth.resolve(request)


Caller = Annotated[Principal, Depends(principal)]

# The pattern is documented, not enforced here: SessionKey.of checks it, so that a bad id is a
# 400 ``invalid-input`` in the path just as in a body.
SessionIdPath = Annotated[
    str,
    Path(
        description="Session id (1-128 of [A-Za-z0-9._:-])",
        json_schema_extra={"pattern": SESSION_ID, "minLength": 1, "maxLength": 128},
    ),
]


async def session_key(caller: Caller, sid: SessionIdPath) -> SessionKey:
    # async although it does no I/O: FastAPI runs sync dependencies in a worker thread.
    return SessionKey.of(caller, sid)


Key = Annotated[SessionKey, Depends(session_key)]


def expired(record: SessionRecord) -> bool:
    return record.expires_at is not None and record.expires_at <= time.time()


async def own_session(st: State, key: Key) -> SessionRecord:
    """The caller's session; unknown, foreign and expired all give the same 404."""
    record = await st.runtime.store.get_session(key)
    if record is None or expired(record):
        raise SessionNotFound("session not found")
    return record


async def drop_if_expired(st: ServerState, key: SessionKey) -> None:
    """An expired session is gone (it answers 404): delete it so that its id starts afresh
    rather than reviving the old history."""
    record = await st.runtime.store.get_session(key)
    if record is None or not expired(record):
        return
    for turn in await st.runtime.store.active_turns(key):
        await st.runtime.scheduler.cancel(key, turn.id, "session_expired")
    await st.runtime.store.delete_session(key)


OwnSession = Annotated[SessionRecord, Depends(own_session)]


def check_message(st: ServerState, text: str) -> None:
    limit = st.settings.limits.max_message_chars
    if len(text) > limit:
        raise TooLarge(f"the message is {len(text)} characters; the limit is {limit}")
