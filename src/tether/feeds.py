"""Live event feeds of the turns running in this process.

A feed keeps every event of its turn in memory while the turn runs, so a subscriber that
attaches late (or re-attaches with ``Last-Event-ID``) reads the events it missed from the feed
and then follows it, with no gap or duplicate, before persistence has caught up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tether.records import Event


class TurnFeed:
    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.events: list[Event] = []
        self.closed = False
        self._changed = asyncio.Event()
        self._waiting = 0

    def publish(self, event: Event) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        # Most events have no follower waiting: skip the Event churn then. Waiters hold the old
        # Event; replacing it makes each wake-up one-shot without a lock.
        if not self._waiting:
            return
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    @property
    def first_seq(self) -> int | None:
        return self.events[0].seq if self.events else None

    async def follow(self, after_seq: int) -> AsyncIterator[Event]:
        """Events with ``seq > after_seq`` until the feed closes."""
        index = 0
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if event.seq > after_seq:
                    yield event
            if self.closed:
                return
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1
