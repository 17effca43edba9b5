"""The caller's own data as a whole: "forget me"."""

from __future__ import annotations

from fastapi import APIRouter

from tether.server.deps import Caller, State
from tether.server.memory_schemas import Forgotten

router = APIRouter(prefix="/v1/users", tags=["users"])


@router.delete("/me/data")
async def forget_me(st: State, caller: Caller) -> Forgotten:
    """Delete everything of yours: sessions with their history and turns, session and user
    memory, your knowledge documents. Shared (agent and tenant) memory stays.

    Like deleting a session, this does not refuse while a turn is queued or running: each of
    your active turns is cancelled first (and waited for, so that none writes after the data is
    gone), then everything is deleted in one transaction. A turn submitted while this runs may
    be lost with its session.
    """
    report = await st.runtime.forget_user(caller.tenant, caller.user)
    return Forgotten(sessions=report.sessions, memory=report.memory, documents=report.documents)
