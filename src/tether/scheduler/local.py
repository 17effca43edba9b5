"""What this process knows of the turns it handles: a cache of the store, never the truth.

The scheduler's parts (the session workers, the turn runner, the chores, the callers waiting
for a turn) share this one object. Nothing here is durable: a process that dies loses it, and
the store still holds every accepted turn, its lease and its outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tether.loop.context import TurnContext
from tether.records import (
    LOCAL_PRINCIPAL,
    CancelStatus,
    Item,
    Lease,
    Principal,
    Reason,
    SessionKey,
    Turn,
)
from tether.scheduler.feeds import Feeds
from tether.scheduler.history import HistoryCache


@dataclass
class RunningTurn:
    """A turn running in this process, with the context that can stop it."""

    turn: Turn
    ctx: TurnContext


class Running(dict[str, RunningTurn]):
    """The turns running in this process, by id; a chore with nothing to watch waits here to
    be told one started, instead of waking on a timer to find none."""

    def __init__(self) -> None:
        super().__init__()
        self._started = asyncio.Event()

    def __setitem__(self, turn_id: str, run: RunningTurn) -> None:
        super().__setitem__(turn_id, run)
        self._started.set()

    async def started(self) -> None:
        """Return once some turn runs here."""
        while not self:
            self._started.clear()
            await self._started.wait()


@dataclass(frozen=True, slots=True)
class Admitted:
    """How a turn started as it was admitted: its user item, the lease it was admitted under,
    and the rings the store had heard before the admission (None: nobody rings it)."""

    item: Item
    lease: Lease
    rings: int | None


@dataclass
class Local:
    workers: dict[SessionKey, asyncio.Task[None]] = field(default_factory=dict)
    """At most one worker task per session with work in this process."""
    dirty: set[SessionKey] = field(default_factory=set)
    """Sessions whose worker must re-read the queue before it gives the session up."""
    kicked: dict[SessionKey, asyncio.Event] = field(default_factory=dict)
    """Set to wake a worker that lingers on its lease."""
    handed: dict[SessionKey, Turn] = field(default_factory=dict)
    """The earliest turn submitted here that the session's worker has not looked at: it tries
    to start it without reading the queue (the store refuses it if an earlier one is active)."""
    granted: dict[SessionKey, tuple[Lease, tuple[str, int] | None]] = field(default_factory=dict)
    """Leases taken with a turn's admission (:class:`~tether.store.capabilities.LeasingQueue`) for
    the session's worker to run it under, with the store's news from before the admission."""
    leases: dict[SessionKey, Lease] = field(default_factory=dict)
    agents: dict[SessionKey, tuple[Lease, str]] = field(default_factory=dict)
    """The agent each session was made with, as read while this process held the lease (it
    counts under that lease only, for turns admitted under it)."""
    claims: dict[SessionKey, asyncio.Event] = field(default_factory=dict)
    """Sessions whose next turn is being admitted under the lease their worker holds here,
    to be started in the same write if nothing is ahead of it
    (:class:`~tether.store.capabilities.StartingQueue`); set once the write has settled. The
    worker does not give the lease up before."""
    started: dict[SessionKey, tuple[Turn, Admitted]] = field(default_factory=dict)
    """A turn started as it was admitted, for the session's worker to run first (the store
    shows it running from then on)."""
    taking: set[asyncio.Future[Any]] = field(default_factory=set)
    """Admissions in flight that may take a session's lease for this process, and start a turn
    under it, as they settle: ``close()`` lets them settle before it waits for the workers."""
    asked: dict[str, tuple[SessionKey, CancelStatus, Reason]] = field(default_factory=dict)
    """Cancels asked here for turns running in the store but not yet registered here (started
    a moment ago), by turn: the turn reads its own as it registers, without waiting for the
    watcher. Dropped when the turn ends here or its session's worker here ends."""
    history: HistoryCache = field(default_factory=HistoryCache)
    """What the holder of each lease here knows of its session's history (windows unread)."""
    running: Running = field(default_factory=Running)
    feeds: Feeds = field(default_factory=Feeds)
    waiters: dict[str, tuple[SessionKey, list[asyncio.Future[Turn]]]] = field(default_factory=dict)
    """Turns accepted here and not yet ended: their key (so a caller naming the turn under
    another key learns nothing) and the futures of callers waiting for the end."""
    accepted_at: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """For a store with a data version (SQLite): the version each turn accepted here was
    submitted under (read before its admission), and the rings the store had heard then (None:
    nobody rings it). While the version has not moved, no other process has written since, so
    none has ended the turn behind this one's back; a commit since rings after that count."""
    slot_freed: dict[SessionKey, asyncio.Event] = field(default_factory=dict)
    slot_waiters: dict[SessionKey, int] = field(default_factory=dict)
    principals: dict[SessionKey, Principal] = field(default_factory=dict)
    """Who submitted the session's latest turn here (tools and memory act for them)."""
    decision_asked: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a turn here parks on a decision: the deadline sweep looks again."""
    closing: bool = False
    closed: bool = False
    """Set once the drain is over: no turn waited for here ends here any more."""

    def resolve(self, turn: Turn) -> None:
        """Hand an ended turn to every local caller waiting for it."""
        _, futures = self.waiters.pop(turn.id, (turn.key, []))
        self.accepted_at.pop(turn.id, None)
        self.asked.pop(turn.id, None)
        for fut in futures:
            if not fut.done():
                fut.set_result(turn)

    def abandon(self, error: Callable[[], BaseException]) -> None:
        """Give every local caller still waiting for a turn an ``error()`` (the process is
        closing and will not run the turns they wait for); the turns stay as they are."""
        self.closed = True
        for _, futures in self.waiters.values():
            for fut in futures:
                if not fut.done():
                    fut.set_exception(error())
                    # Marked as seen: a caller that left meanwhile never will, and the loop
                    # would log "exception was never retrieved" for it.
                    fut.exception()
            futures.clear()

    def parked(self, turn: Turn) -> None:
        """Tell the local callers waiting for a turn that it waits for a decision (they may
        ask it); the turn stays theirs to wait for until it ends."""
        self.decision_asked.set()
        entry = self.waiters.get(turn.id)
        if entry is None:
            return
        futures = list(entry[1])
        entry[1].clear()
        for fut in futures:
            if not fut.done():
                fut.set_result(turn)

    def started_under(self, key: SessionKey, lease: Lease) -> Turn | None:
        """The turn started under ``lease`` as it was admitted, for the worker holding that
        lease to run (one started under another lease is for the worker that holds it next)."""
        started = self.started.get(key)
        return started[0] if started is not None and started[1].lease is lease else None

    def principal_of(self, key: SessionKey) -> Principal:
        known = self.principals.get(key)
        if known is not None:
            return known
        if key.tenant == LOCAL_PRINCIPAL.tenant and key.owner == LOCAL_PRINCIPAL.user:
            return LOCAL_PRINCIPAL
        return Principal(key.tenant, key.owner)

    def free_slot(self, key: SessionKey) -> None:
        """A turn of ``key`` ended: a caller waiting for room in its queue may try again."""
        freed = self.slot_freed.pop(key, None)
        if freed is not None:
            freed.set()
