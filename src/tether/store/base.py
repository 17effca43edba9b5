"""The store seam: everything durable goes through this protocol.

Two rules every implementation keeps, and the conformance suite checks:

* **Scoped by key.** Every read and write names a :class:`SessionKey` (tenant, owner, id); a
  session of another owner is simply not there.
* **Fenced writes.** A turn's writes carry the :class:`Lease` they were made under. The
  implementation checks, *in the same transaction as the write*, that the lease's token is still
  the session's current one, and raises :class:`StaleLease` otherwise, so a process that lost its
  lease (paused, partitioned, presumed dead) can never add to a history someone else now owns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from tether.records import (
    Event,
    Item,
    Lease,
    NewItem,
    Policy,
    SessionKey,
    SessionRecord,
    Turn,
    TurnEnding,
)
from tether.store.recall import RecallStore

DEFAULT_MAX_QUEUE = 16
ABORTED_TOOL_RESULT = "Tool call aborted: the turn ended before the tool returned a result."


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as stored: only the hash of its secret is kept."""

    id: str
    tenant: str
    user: str
    roles: frozenset[str]
    hash: str
    created_at: float
    revoked_at: float | None


@dataclass(frozen=True, slots=True)
class SessionStats:
    items: int
    turns: int
    active_turns: int


def initial_token() -> int:
    """The first fencing token of a new session.

    Tokens only ever grow for one session row; starting a new row at the clock (in
    microseconds) keeps them growing across a delete and re-create of the same id too, so a
    lease from before the delete can never match a lease after it.
    """
    return int(time.time() * 1_000_000)


class NewEvent:
    """An event as a turn produces it; ``seq`` is assigned by the turn's single writer."""

    __slots__ = ("data", "seq", "type")

    def __init__(self, seq: int, type: str, data: dict[str, Any]) -> None:
        self.seq = seq
        self.type = type
        self.data = data


class Store(RecallStore, Protocol):
    async def open(self) -> None:
        """Connect and apply pending migrations."""
        ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise :class:`StoreError` when the store cannot answer."""
        ...

    # -- sessions ------------------------------------------------------------------------------
    async def create_session(
        self,
        key: SessionKey,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        exist_ok: bool = False,
    ) -> tuple[SessionRecord, bool]:
        """Create the session; returns ``(record, created)``.

        With ``exist_ok`` an existing session is returned unchanged; otherwise it is a Conflict.
        """
        ...

    async def get_session(self, key: SessionKey) -> SessionRecord | None: ...

    async def list_sessions(
        self, tenant: str, owner: str, *, limit: int = 50, after: str | None = None
    ) -> list[SessionRecord]:
        """The owner's sessions ordered by ``session_id``, those after ``after``."""
        ...

    async def update_session(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        """Replace the given fields; raises SessionNotFound, or Conflict on a moved revision."""
        ...

    async def delete_session(self, key: SessionKey) -> bool:
        """Delete the session with its items, turns and events."""
        ...

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        """History in ``seq`` order, excluded items included (they are flagged)."""
        ...

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        """The newest items that may reach a model, newest first, for paging backwards.

        Excluded items (of failed or rolled back turns) are left out. Cost is proportional to
        ``limit``, not to the length of the history.
        """
        ...

    async def latest_summary(self, key: SessionKey) -> Item | None:
        """The newest ``summary`` item whose turn did not fail or roll back, if any."""
        ...

    async def clear_items(self, key: SessionKey) -> int:
        """Delete the session's history (summaries included); SessionBusy while a turn is active."""
        ...

    # -- turns ---------------------------------------------------------------------------------
    async def enqueue_turn(
        self,
        key: SessionKey,
        *,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> Turn:
        """Queue a turn at the next ``seq`` and write its ``turn.queued`` event, atomically.

        ``reject``: SessionBusy if any turn is queued or running. ``enqueue``: QueueFull when
        ``max_queue`` turns are already queued. Raises SessionNotFound for an unknown session
        and for one past its ``expires_at``.
        """
        ...

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None: ...

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]: ...

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        """Queued and running turns in ``seq`` order."""
        ...

    async def cancel_queued_turn(self, key: SessionKey, turn_id: str, reason: str) -> Turn | None:
        """End a turn that is still queued as ``cancelled``; None when it is no longer queued."""
        ...

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        """Take the session's lease if it is free or expired, with a new (incremented) token.

        Returns None while another owner holds an unexpired lease.
        """
        ...

    async def lease_holder(self, key: SessionKey) -> str | None:
        """The owner of the session's unexpired lease, or None."""
        ...

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        """Take the lease from ``from_owner`` (known to be dead) even though it has not expired.

        Conditional on ``from_owner`` still holding it, so two takers cannot both win.
        """
        ...

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        """Extend each lease still current; returns the renewed ones (the others are lost)."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up if it is still current (no-op otherwise)."""
        ...

    # -- fenced turn writes --------------------------------------------------------------------
    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        """Move a queued turn to running and write its first items and events."""
        ...

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]: ...

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
    ) -> Turn:
        """Write the last items and events and the terminal status in one transaction.

        ``failed`` marks the turn's items excluded; ``rolled_back`` deletes them.
        """
        ...

    async def recover(self, lease: Lease) -> list[Turn]:
        """Under a freshly acquired lease: end turns left ``running`` as failed/``owner_lost``.

        Unanswered tool calls get an aborted result, and each such turn gets its terminal event.
        """
        ...

    async def request_cancel(self, key: SessionKey, turn_id: str, status: str, reason: str) -> bool:
        """Ask whichever process runs ``turn_id`` to end it as ``status`` with ``reason``.

        Only a running turn can be asked, and the first request wins: returns False when the
        turn is not running or already has a request. The owner reads requests with
        :meth:`cancel_requests` and ends the turn itself (its writes stay fenced).
        """
        ...

    async def cancel_requests(self, turn_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """``turn_id → (status, reason)`` for the given turns that have a request pending."""
        ...

    # -- events --------------------------------------------------------------------------------
    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]: ...

    async def session_stats(self, key: SessionKey) -> SessionStats:
        """Counts of items, turns and queued-or-running turns; SessionNotFound when absent."""
        ...

    # -- API keys ------------------------------------------------------------------------------
    async def create_api_key(self, key: ApiKey) -> None: ...

    async def api_key_by_hash(self, digest: str) -> ApiKey | None: ...

    async def list_api_keys(self) -> list[ApiKey]: ...

    async def revoke_api_key(self, key_id: str) -> bool:
        """Mark the key revoked; False when there is no such active key."""
        ...

    async def count_api_keys(self) -> int:
        """Active (unrevoked) keys."""
        ...

    # -- maintenance ---------------------------------------------------------------------------
    async def sweep_expired(self, now: float, limit: int = 500) -> int:
        """Delete up to ``limit`` sessions past ``expires_at`` that are idle; returns how many.

        Idle means no queued or running turn and no unexpired lease, so a sweep never pulls a
        session from under a turn. Safe to run on every node at once: each delete is atomic.
        """
        ...

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        """Sessions with a queued or running turn (for recovery after a restart).

        With ``unowned_at``, only those whose lease is free or expired at that time: work
        nobody is doing (its process died, or a store outage made it give up).
        """
        ...


@runtime_checkable
class CancelFeed(Protocol):
    """A store that can tell the owner of a turn of a cancel request as it is made.

    Optional: without it, owners find requests by polling :meth:`Store.cancel_requests`. With it
    (PostgreSQL ``LISTEN/NOTIFY``), a request reaches the owning process in one round trip.
    """

    async def listen_cancels(self, heard: Callable[[str], None], ready: Callable[[], None]) -> None:
        """Call ``ready()`` once listening, then ``heard(turn_id)`` for every request, until the
        link drops; then return or raise."""
        ...
