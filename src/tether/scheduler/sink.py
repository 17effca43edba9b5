"""Where the turn loop meets the store: the fenced sink it writes through, the history it reads.

Every write here carries the lease: the store checks its fencing token in the same transaction
as the write, so a process that lost the session can add nothing to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tether.errors import StaleLease
from tether.events import (
    DECISION_REQUESTED,
    MEMORY_WRITTEN,
    TURN_AWAITING_INPUT,
    TURN_ENDED,
    TURN_RESUMED,
    TURN_STARTED,
    EventType,
)
from tether.memory.prompt import written_event_data
from tether.records import (
    Decision,
    Item,
    Lease,
    MemoryWrites,
    NewEvent,
    NewItem,
    Turn,
    TurnEnding,
    Usage,
)
from tether.scheduler.feeds import TurnFeed
from tether.scheduler.history import HistoryCache
from tether.store.capabilities import ReleasingEnd
from tether.store.protocol import FencedWrites
from tether.store.rules import LIVE_AHEAD, decision_data, keeps_memory

log = logging.getLogger("tether.scheduler")


FLUSH_INTERVAL = 0.25
"""Seconds a streamed event may wait in the buffer before it is written without a commit."""


class FencedSink:
    """Buffers a turn's events and writes them, with its items, under the session lease.

    Events are published to the live feed at once and persisted with the next commit, or at
    the latest ``flush_interval`` seconds after they were emitted: a streamed reply costs a
    transaction per step or per interval, not one per token, and a follower in another
    process (which reads the store) still sees it come in. One lock orders every write of the
    turn, so events reach the store in seq order whichever path writes them.
    """

    def __init__(
        self,
        store: FencedWrites,
        lease: Lease,
        turn_id: str,
        feed: TurnFeed,
        *,
        flush_interval: float = FLUSH_INTERVAL,
        next_seq: int = 2,
        history: HistoryCache | None = None,
    ) -> None:
        self._store = store
        # Told of every item written, so the lease's known history stays whole.
        self._history = history if history is not None else HistoryCache()
        self.lease = lease
        self._turn_id = turn_id
        self._feed = feed
        # seq 1 is turn.queued, written when the turn was accepted; a resumed turn goes on
        # after the events it (and its decision) wrote before.
        self._next_seq = next_seq
        self._stored = next_seq - 1
        """The highest seq known stored: events up to :data:`LIVE_AHEAD` past it are published
        at once, later ones held back until a write catches up."""
        self._held: list[tuple[NewEvent, float]] = []
        self._buffer: list[NewEvent] = []
        self._inflight: asyncio.Task[list[Item]] | None = None
        self._open_calls: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._flush_interval = flush_interval
        self._timer: asyncio.TimerHandle | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._started = False
        self._stale: StaleLease | None = None
        self._letting_go: tuple[ReleasingEnd, Callable[[], bool]] | None = None
        self.released = False
        """The turn's ending gave the session's lease up (:meth:`let_go`)."""

    def let_go(self, store: ReleasingEnd, when: Callable[[], bool]) -> None:
        """End the turn through ``store``, giving the lease up with the ending if ``when()``
        says so as the ending is written (and no other turn of the session is active then)."""
        self._letting_go = (store, when)

    def emit(self, type: EventType, data: dict[str, Any]) -> None:
        event = self._add(type, data)
        if self._held or event.seq - self._stored > LIVE_AHEAD:
            # Too far ahead of the store: were this process to die now, the turn's ending
            # (written by whoever recovers it) must come after every seq a follower saw.
            self._held.append((event, time.time()))
            if self._started and self._flush_interval > 0:
                asyncio.get_running_loop().call_soon(self._flush_due)
            return
        self._feed.publish(event, time.time())
        if self._started and self._timer is None and self._flush_interval > 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._flush_interval, self._flush_due)

    def _emit_once_written(self, type: EventType, data: dict[str, Any]) -> None:
        """Buffer an event that is published only once the write that stores it returns
        (:meth:`_wrote`), after everything emitted before it: an ending or a parking. A follower
        that hears ``turn.ended`` and then reads the turn must find it ended, from any
        connection of any process (on PostgreSQL another pool connection read it as running
        still, and the OpenAI face told the client it waited for a decision); and an ending
        the store refuses (the lease lost meanwhile) was never the turn's."""
        self._held.append((self._add(type, data), time.time()))

    def _wrote(self, events: Sequence[NewEvent]) -> None:
        """``events`` are stored: publish what was held back for them."""
        if events:
            self._stored = max(self._stored, events[-1].seq)
        while self._held and self._held[0][0].seq - self._stored <= LIVE_AHEAD:
            event, at = self._held.pop(0)
            self._feed.publish(event, at)

    def _add(self, type: EventType, data: dict[str, Any]) -> NewEvent:
        event = NewEvent(self._next_seq, type, data)
        self._next_seq += 1
        self._buffer.append(event)
        return event

    def take_events(self) -> list[NewEvent]:
        events, self._buffer = self._buffer, []
        return events

    def _flush_due(self) -> None:
        self._timer = None
        if self._buffer and (self._flusher is None or self._flusher.done()):
            self._flusher = asyncio.ensure_future(self._flush())

    async def _flush(self) -> None:
        async with self._lock:
            events = self.take_events()
            if not events or self._stale is not None:
                return
            try:
                await self._store.append(self.lease, self._turn_id, [], events)
                self._wrote(events)
                if self._buffer and self._started and self._timer is None:
                    # Emitted while this write was under way (and held back, if any): their
                    # flush is due now, or at the usual interval.
                    delay = 0.0 if self._held else self._flush_interval
                    loop = asyncio.get_running_loop()
                    self._timer = loop.call_later(delay, self._flush_due)
            except StaleLease as exc:
                self._stale = exc  # the turn's next write raises it and the turn stops
            except Exception:
                # Keep them for the next write; the live feed already has them.
                log.warning(
                    "could not write buffered events of turn %s; will retry",
                    self._turn_id,
                    exc_info=True,
                )
                self._buffer[:0] = events

    async def start(self, user_input: str) -> Item:
        """Write the user's item and ``turn.started``. Raises :class:`Conflict` when the turn
        is no longer queued (another process ended it since the worker read the queue)."""
        # Published once written, not before: a start the store refuses never happened, and
        # a follower shown its seq would skip the ending that other process wrote there.
        started, at = self._add(TURN_STARTED, {"turn_id": self._turn_id}), time.time()
        async with self._lock:
            events = self.take_events()
            items = await self._store.start_turn(
                self.lease, self._turn_id, [NewItem("user", user_input)], events
            )
            self._stored = events[-1].seq
            self._history.wrote(self.lease, items)
        self._feed.publish(started, at)
        self._started = True
        return items[0]

    def started_with_admission(self, item: Item) -> Item:
        """The turn was started as it was admitted (``turn.started`` written then, seq 2, with
        the user's ``item``): take it up from there, as :meth:`start` would have left it."""
        self._next_seq = max(self._next_seq, 3)
        self._stored = max(self._stored, 2)
        self._history.wrote(self.lease, [item])
        self._feed.publish(NewEvent(2, TURN_STARTED, {"turn_id": self._turn_id}), time.time())
        self._started = True
        return item

    async def resume(self) -> tuple[list[Item], MemoryWrites | None]:
        """Take a decided turn up again: ``turn.resumed``, the turn back to running; returns
        its items so far (whose unanswered calls are then open) and the memory it held.
        Raises :class:`Conflict` when the turn is no longer parked (ended elsewhere)."""
        # Published once written.
        resumed, at = self._add(TURN_RESUMED, {"turn_id": self._turn_id}), time.time()
        async with self._lock:
            events = self.take_events()
            items, memory = await self._store.resume_turn(self.lease, self._turn_id, events)
            self._stored = events[-1].seq
            # Parked, the session may have been written without the lease in ways no seq
            # shows (a decision is not an item, but whoever decided may have done more): read.
            self._history.forget(self.lease.key)
        self._feed.publish(resumed, at)
        self._started = True
        self._track(items)
        return items, memory

    async def park(
        self,
        items: Sequence[NewItem],
        decision: Decision,
        usage: Usage,
        memory: MemoryWrites | None,
    ) -> Turn:
        """Write what the step did so far with the decision it waits for, and park the turn
        (``awaiting_input``): ``decision.requested`` and ``turn.awaiting_input`` go with it,
        published once it is committed."""
        self.close()
        async with self._lock:
            if self._stale is not None:
                raise self._stale
            self._emit_once_written(DECISION_REQUESTED, decision_data(decision))
            self._emit_once_written(
                TURN_AWAITING_INPUT, {"turn_id": self._turn_id, "call_id": decision.call_id}
            )
            events = self.take_events()
            parked = await self._store.park_turn(
                self.lease, self._turn_id, items, events, decision, usage=usage, memory=memory
            )
            self._wrote(events)
            self._history.ended(self.lease, self._turn_id, items, parked.status)
            return parked

    async def commit(self, items: Sequence[NewItem]) -> list[Item]:
        task = asyncio.ensure_future(self._append(items))
        self._inflight = task
        # Shielded: a cancellation of the turn must not leave us unsure whether this write
        # happened; settle() waits for it and open_calls() then tells the truth.
        written = await asyncio.shield(task)
        self._track(written)
        return written

    async def _append(self, items: Sequence[NewItem]) -> list[Item]:
        async with self._lock:
            if self._stale is not None:
                raise self._stale
            events = self.take_events()
            written = await self._store.append(self.lease, self._turn_id, items, events)
            self._wrote(events)
            self._history.wrote(self.lease, written)
            return written

    async def end(
        self,
        ending: TurnEnding,
        items: Sequence[NewItem],
        terminal: dict[str, Any],
        memory: MemoryWrites | None = None,
    ) -> Turn:
        """Write the last items, the remaining events and ``turn.ended`` with the ending, and
        the turn's memory writes if the ending keeps its items, all in one transaction;
        ``turn.ended`` (and ``memory.written``) are published once it is committed."""
        self.close()
        async with self._lock:
            if self._stale is not None:
                raise self._stale
            if memory and keeps_memory(ending.status):
                for record, _ in memory.put:
                    self._emit_once_written(MEMORY_WRITTEN, written_event_data(record))
            self._emit_once_written(TURN_ENDED, terminal)
            events = self.take_events()
            letting_go = self._letting_go
            if letting_go is not None and letting_go[1]():
                ended, self.released = await letting_go[0].end_turn_released(
                    self.lease, self._turn_id, ending, items, events, memory=memory
                )
            else:
                ended = await self._store.end_turn(
                    self.lease, self._turn_id, ending, items, events, memory=memory
                )
            self._wrote(events)
            self._history.ended(self.lease, self._turn_id, items, ended.status)
            return ended

    def close(self) -> None:
        """No more timed flushes (the turn is ending or was abandoned)."""
        self._started = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _track(self, written: Sequence[Item]) -> None:
        for item in written:
            if item.kind == "tool_call" and item.call_id:
                self._open_calls[item.call_id] = item.tool_name or ""
            elif item.kind == "tool_result" and item.call_id:
                self._open_calls.pop(item.call_id, None)

    async def settle(self) -> None:
        task, self._inflight = self._inflight, None
        if task is None:
            return
        written = await task  # StaleLease propagates: the turn is no longer ours
        self._track(written)

    def open_calls(self) -> list[tuple[str, str]]:
        return list(self._open_calls.items())
