"""The caller's own data as a whole: "forget me"."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter

from tether.errors import NotFound
from tether.records import SessionKey
from tether.server.deps import Caller, State
from tether.server.memory_schemas import Forgotten
from tether.server.state import ServerState

router = APIRouter(prefix="/v1/users", tags=["users"])

PAGE = 200


async def _cancel(st: ServerState, key: SessionKey) -> None:
    # A session or turn gone meanwhile has nothing left to cancel.
    with contextlib.suppress(NotFound):
        for turn in await st.runtime.store.active_turns(key):
            with contextlib.suppress(NotFound):
                await st.runtime.scheduler.cancel(key, turn.id, "user_data_deleted")


@router.delete("/me/data")
async def forget_me(st: State, caller: Caller) -> Forgotten:
    """Delete everything of yours: sessions with their history and turns, session and user
    memory, your knowledge documents. Shared (agent and tenant) memory stays.

    Like deleting a session, this does not refuse while a turn is queued or running: each of
    your active turns is cancelled first (and waited for, so that none writes after the data is
    gone), then everything is deleted in one transaction. A turn submitted while this runs may
    be lost with its session.
    """
    after: str | None = None
    while True:
        sessions = await st.runtime.store.list_sessions(
            caller.tenant, caller.user, limit=PAGE, after=after
        )
        await asyncio.gather(*(_cancel(st, s.key) for s in sessions))
        if len(sessions) < PAGE:
            break
        after = sessions[-1].key.session_id
    report = await st.runtime.memory.forget_user(caller.tenant, caller.user)
    return Forgotten(sessions=report.sessions, memory=report.memory, documents=report.documents)
