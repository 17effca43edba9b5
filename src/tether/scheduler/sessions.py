"""Sessions as every front door sees them: the caller's own, and never pulled from under a turn.

The HTTP routes, the CLI and the ``Session`` facade create, read, change, clear and delete
sessions through :class:`SessionService`, never through the store, so the rules live here once:
:meth:`SessionService.own` answers an expired session as unknown, and the HTTP API replaces it
rather than revives it when its id is used again (``replace_expired``); deleting a session (or
a whole user) first cancels its queued and running turns and waits for them to end, so no turn
writes after its session is gone. The plain reads (``get``, ``items``, ``turns``, ``stats``)
apply no expiry rule: callers check ownership with :meth:`own` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tether.errors import NotFound, SessionBusy, SessionNotFound, TurnNotFound
from tether.records import (
    Event,
    Item,
    Reason,
    SessionKey,
    SessionOrder,
    SessionRecord,
    SessionStats,
    Turn,
)
from tether.store import rules
from tether.store.protocol import HistoryStore, LeaseStore, SessionStore, TurnLog, TurnReader
from tether.tools.mcp import McpSessions
from tether.tools.workspace import discard

OFFLINE_CANCEL_WAIT = 30.0
"""Seconds an offline canceller waits for another process to end a running turn."""
FOLLOWERS_GRACE = 0.1
"""Seconds a deletion that ended turns waits before the rows go: two of the store polls a
follower of a turn run elsewhere makes (:func:`tether.scheduler.feeds.follow_turn`)."""


class Canceller(Protocol):
    """Ends a queued or running turn and returns it (the scheduler is one)."""

    async def cancel(self, key: SessionKey, turn_id: str, reason: Reason = "cancelled") -> Turn: ...


class SessionServiceStore(SessionStore, HistoryStore, TurnReader, Protocol):
    """What the session service uses: sessions, their history, their turns."""


@dataclass(frozen=True, slots=True)
class SessionPage:
    records: list[SessionRecord]
    """The page's live sessions (expired ones left out, so it may hold fewer than asked)."""
    next_cursor: str | None


class SessionService:
    def __init__(
        self,
        store: SessionServiceStore,
        canceller: Canceller,
        *,
        max_sessions: int | None = None,
        workspace_root: Path | None = None,
        mcp: McpSessions | None = None,
        noted: Callable[[SessionRecord], None] | None = None,
    ) -> None:
        self._store = store
        self._canceller = canceller
        self._noted = noted
        """Told of each session made or read here for a door (the scheduler remembers its
        agent, so the session's next turns need no read of it)."""
        self.max_sessions = max_sessions
        """How many sessions one owner may keep (None: unbounded)."""
        self.workspace_root = workspace_root
        """Where the sessions' workspaces are (None: they have none here); each goes with its
        session."""
        self.mcp = mcp
        """The sessions' MCP connections in this process; a deleted session's are closed."""

    # -- reading ---------------------------------------------------------------------------------
    async def get(self, key: SessionKey) -> SessionRecord | None:
        """The session as stored, expired or not (None when there is none)."""
        return await self._store.get_session(key)

    async def own(self, key: SessionKey) -> SessionRecord:
        """The caller's live session; unknown, foreign and expired all raise the same."""
        record = await self._store.get_session(key)
        if record is None or record.expired():
            raise SessionNotFound("session not found")
        if self._noted is not None:
            self._noted(record)
        return record

    async def page(
        self,
        tenant: str,
        owner: str,
        *,
        limit: int = 50,
        after: str | None = None,
        include_expired: bool = False,
        order: SessionOrder = "id",
        contains: str | None = None,
    ) -> SessionPage:
        """The owner's sessions by id (or the most recently active first), ``limit`` at a time;
        pass ``next_cursor`` as ``after``. ``contains``: those whose id contains the text.

        Expired sessions are left out (they answer as unknown) unless ``include_expired``: the
        operator's listing of a local store shows them until they are swept.
        """
        records = await self._store.list_sessions(
            tenant, owner, limit=limit + 1, after=after, order=order, contains=contains
        )
        page = records[:limit]
        more = len(records) > limit and bool(page)
        now = time.time()
        cursor = None
        if more:
            last = page[-1]
            cursor = rules.newest_cursor(last) if order == "newest" else last.key.session_id
        return SessionPage([r for r in page if include_expired or not r.expired(now)], cursor)

    async def stats(self, key: SessionKey) -> SessionStats:
        return await self._store.session_stats(key)

    async def items(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> list[Item]:
        return await self._store.list_items(key, after_seq=after, limit=limit)

    async def recent(
        self, key: SessionKey, *, before: int | None = None, limit: int = 64
    ) -> list[Item]:
        """The newest items a model may see (excluded ones left out), newest first: a page
        backwards from ``before``, at a cost proportional to ``limit``."""
        return await self._store.recent_items(key, before_seq=before, limit=limit)

    async def turns(self, key: SessionKey, *, after: int = 0, limit: int = 100) -> list[Turn]:
        return await self._store.list_turns(key, after_seq=after, limit=limit)

    async def turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        return await self._store.get_turn(key, turn_id)

    async def stored_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        """A page of the turn's events as stored, after ``after_seq`` (no following)."""
        return await self._store.list_events(key, turn_id, after_seq=after_seq, limit=limit)

    async def latest_event_seq(self, key: SessionKey, turn_id: str) -> int:
        """The seq of the turn's latest event, 0 for none (a stream that goes on after it
        repeats nothing)."""
        seq, page = 0, 1000
        while True:
            events = await self.stored_events(key, turn_id, after_seq=seq, limit=page)
            if events:
                seq = events[-1].seq
            if len(events) < page:
                return seq

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        """The session's turns not ended (queued, running, awaiting input), in order."""
        return await self._store.active_turns(key)

    # -- changing ----------------------------------------------------------------------------------
    async def create(
        self,
        key: SessionKey,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        exist_ok: bool = False,
        replace_expired: bool = False,
        idle: bool = False,
    ) -> tuple[SessionRecord, bool]:
        """Create the session (``exist_ok``: or return the one there); ``(record, created)``.
        ``idle``: ``ttl_seconds`` counts from its latest activity, not its creation.

        ``replace_expired`` (the HTTP API's way): an expired session under the id is deleted
        first, so the id starts afresh rather than reviving the old history. Without it an
        expired session is returned as it is, and turns on it are refused (embedded use, where
        ``Session.is_expired()`` is how a caller learns of it).
        """
        if replace_expired:
            await self.drop_if_expired(key)
        # ``idle`` only when asked: a store written against the protocol before it had the
        # argument still makes every other session.
        record, created = await self._store.create_session(
            key,
            agent,
            metadata=metadata,
            ttl_seconds=ttl_seconds,
            exist_ok=exist_ok,
            max_sessions=self.max_sessions,
            **({"idle": True} if idle else {}),
        )
        if self._noted is not None and not record.expired():
            self._noted(record)
        return record, created

    async def update(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        return await self._store.update_session(
            key,
            metadata=metadata,
            state=state,
            ttl_seconds=ttl_seconds,
            expected_revision=expected_revision,
        )

    async def clear(self, key: SessionKey, *, workspace: bool = False) -> int:
        """Delete the history (summaries included); SessionBusy while a turn is active. With
        ``workspace``, the session's workspace files too."""
        cleared = await self._store.clear_items(key)
        if workspace:
            # Its MCP servers first: one still running there would go on writing into the
            # tree being removed (a turn that needs them starts them again).
            if self.mcp is not None:
                await self.mcp.close_session(key)
            await discard(self.workspace_root, [key])
        return cleared

    async def delete(self, key: SessionKey, reason: Reason = "session_deleted") -> bool:
        """Cancel the session's active turns (waiting for each to end), then delete it, its MCP
        servers and its workspace."""
        if await self.cancel_active(key, reason):
            # Those turns' followers read their endings from the store (every 50 ms, here or
            # in another process): give them that long, twice, before the rows go, or their
            # streams end without the ending.
            await asyncio.sleep(FOLLOWERS_GRACE)
        deleted = await self._store.delete_session(key)
        if self.mcp is not None:  # after its turns ended: none starts a server again
            await self.mcp.close_session(key)
        # Also when there was no such row: a workspace left by a session deleted elsewhere
        # (another node, a crash between the two) goes now, before the id is used again.
        await discard(self.workspace_root, [key])
        return deleted

    async def drop_if_expired(self, key: SessionKey) -> None:
        """An expired session is gone (it answers 404): delete it, cancelling what it still
        has queued, so that its id starts afresh."""
        record = await self._store.get_session(key)
        if record is not None and record.expired():
            await self.delete(key, "session_expired")

    async def cancel_active(self, key: SessionKey, reason: Reason) -> int:
        """End every queued or running turn of the session; a session or turn that goes away
        meanwhile has nothing left to cancel. How many there were."""
        active: list[Turn] = []
        with contextlib.suppress(NotFound):
            active = await self._store.active_turns(key)
            for turn in active:
                with contextlib.suppress(NotFound):
                    await self._canceller.cancel(key, turn.id, reason)
        return len(active)

    async def cancel_all_of(
        self, tenant: str, owner: str, reason: Reason, *, page: int = 200
    ) -> int:
        """:meth:`cancel_active` for every session of one owner (before forgetting them);
        returns how many sessions were looked at."""
        after: str | None = None
        seen = 0
        while True:
            records = await self._store.list_sessions(tenant, owner, limit=page, after=after)
            await asyncio.gather(*(self.cancel_active(r.key, reason) for r in records))
            seen += len(records)
            if len(records) < page:
                return seen
            after = records[-1].key.session_id


class OfflineStore(TurnLog, LeaseStore, Protocol):
    """What cancelling through the store takes: the turn log and who holds the session."""


class StoreCanceller:
    """Cancels turns through the store alone, for a process that runs no scheduler (the CLI
    working on a local store): a queued turn ends at once; a running one is asked to end, which
    the process running it does, and is waited for up to ``wait`` seconds — while a live process
    holds its session. With no live holder nobody can write for the turn any more (its owner's
    lease is gone, so its writes are fenced off), and it is returned as it is."""

    def __init__(self, store: OfflineStore, *, wait: float = OFFLINE_CANCEL_WAIT) -> None:
        self._store = store
        self._wait = wait

    async def cancel(self, key: SessionKey, turn_id: str, reason: Reason = "cancelled") -> Turn:
        turn = await self._store.get_turn(key, turn_id)
        if turn is None:
            raise TurnNotFound("turn not found")
        if turn.status in ("queued", "awaiting_input"):
            ended = await self._store.end_waiting_turn(key, turn_id, reason)
            if ended is not None:
                return ended
        await self._store.request_cancel(key, turn_id, "cancelled", reason)
        deadline = time.monotonic() + self._wait
        while True:
            turn = await self._store.get_turn(key, turn_id)
            if turn is None:
                raise TurnNotFound("turn not found")
            if turn.ended or await self._store.lease_holder(key) is None:
                return turn
            if time.monotonic() >= deadline:
                raise SessionBusy(
                    f"turn {turn_id} is still running in another process, which did not end it"
                    f" within {self._wait:g} s; try again",
                    busy_turn_id=turn_id,
                )
            await asyncio.sleep(0.05)
