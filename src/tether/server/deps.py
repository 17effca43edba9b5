"""Route dependencies: the principal first, then the caller's own session."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Path, Request

from tether.errors import SessionNotFound, TooLarge
from tether.records import Principal, SessionKey, SessionRecord
from tether.server.state import ServerState, state_of

State = Annotated[ServerState, Depends(state_of)]


async def principal(request: Request, st: State) -> Principal:
    return await st.auth.resolve(request)


Caller = Annotated[Principal, Depends(principal)]

SessionIdPath = Annotated[str, Path(description="Session id (1-128 of [A-Za-z0-9._:-])")]


def session_key(caller: Caller, sid: SessionIdPath) -> SessionKey:
    return SessionKey.of(caller, sid)


Key = Annotated[SessionKey, Depends(session_key)]


async def own_session(st: State, key: Key) -> SessionRecord:
    """The caller's session; unknown, foreign and expired all give the same 404."""
    record = await st.runtime.store.get_session(key)
    if record is None or (record.expires_at is not None and record.expires_at <= time.time()):
        raise SessionNotFound("session not found")
    return record


OwnSession = Annotated[SessionRecord, Depends(own_session)]


def check_message(st: ServerState, text: str) -> None:
    limit = st.settings.limits.max_message_chars
    if len(text) > limit:
        raise TooLarge(f"the message is {len(text)} characters; the limit is {limit}")
