"""Running one turn under a lease: the fenced sink, the history reader, and the commit of the end.

This is the only place the turn loop meets the store, and every write here carries the lease:
the store checks its fencing token in the same transaction as the write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from tether.feeds import TurnFeed
from tether.records import Event, Item, Lease, NewItem, SessionKey
from tether.store.base import NewEvent, Store


class StoreHistory:
    def __init__(self, store: Store, key: SessionKey) -> None:
        self._store = store
        self._key = key

    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        return await self._store.recent_items(self._key, before_seq=before_seq, limit=limit)


class FencedSink:
    """Buffers a turn's events and writes them, with its items, under the session lease.

    Events are published to the live feed at once and persisted with the next commit, so a
    streamed reply costs one transaction per step, not one per token.
    """

    def __init__(self, store: Store, lease: Lease, turn_id: str, feed: TurnFeed) -> None:
        self._store = store
        self.lease = lease
        self._turn_id = turn_id
        self._feed = feed
        self._next_seq = 2  # seq 1 is turn.queued, written when the turn was accepted
        self._buffer: list[NewEvent] = []
        self._inflight: asyncio.Task[list[Item]] | None = None
        self._open_calls: dict[str, str] = {}

    def emit(self, type: str, data: dict[str, Any]) -> None:
        event = NewEvent(self._next_seq, type, data)
        self._next_seq += 1
        self._buffer.append(event)
        self._feed.publish(Event(self._turn_id, event.seq, type, data, time.time()))

    def take_events(self) -> list[NewEvent]:
        events, self._buffer = self._buffer, []
        return events

    async def start(self, user_input: str) -> Item:
        self.emit("turn.started", {"turn_id": self._turn_id})
        items = await self._store.start_turn(
            self.lease, self._turn_id, [NewItem("user", user_input)], self.take_events()
        )
        return items[0]

    async def commit(self, items: Sequence[NewItem]) -> list[Item]:
        task = asyncio.ensure_future(
            self._store.append(self.lease, self._turn_id, items, self.take_events())
        )
        self._inflight = task
        # Shielded: a cancellation of the turn must not leave us unsure whether this write
        # happened; settle() waits for it and open_calls() then tells the truth.
        written = await asyncio.shield(task)
        self._track(written)
        return written

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

    def next_event(self, type: str, data: dict[str, Any]) -> NewEvent:
        """The terminal event: built here so it takes the next seq, then written by end_turn."""
        self.emit(type, data)
        return self._buffer[-1]
