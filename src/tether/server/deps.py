"""Route dependencies: the principal first, then the caller's own session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Request

from tether.errors import InvalidInput, TooLarge
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


async def own_session(st: State, key: Key) -> SessionRecord:
    """The caller's session; unknown, foreign and expired all give the same 404."""
    return await st.runtime.sessions.own(key)


OwnSession = Annotated[SessionRecord, Depends(own_session)]


@dataclass(frozen=True, slots=True)
class Asking:
    """The caller and the key of its session, unread, from one dependency (FastAPI solves
    each dependency with a walk of its own, and three cost more than the checks): for a route
    whose store write finds the session itself (unknown, foreign and expired fail there with
    the same 404)."""

    st: ServerState
    caller: Principal
    key: SessionKey


async def asking(request: Request, sid: SessionIdPath) -> Asking:
    st = await state_of(request)
    caller = await principal(request, st)
    return Asking(st, caller, await session_key(caller, sid))


AskingSession = Annotated[Asking, Depends(asking)]


def check_message(st: ServerState, text: str) -> None:
    limit = st.settings.limits.max_message_chars
    if len(text) > limit:
        raise TooLarge(f"the message is {len(text)} characters; the limit is {limit}")
    if "\x00" in text:
        # Refused on every backend alike: PostgreSQL text cannot hold a NUL, SQLite's can.
        raise InvalidInput("the message must not contain NUL characters")
