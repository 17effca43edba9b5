"""Live event feeds of the turns running in this process.

A feed keeps every event of its turn in memory while the turn runs, so a subscriber that
attaches late (or re-attaches with ``Last-Event-ID``) reads the events it missed from the feed
and then follows it, with no gap or duplicate, before persistence has caught up. It keeps them
as the sink made them (:class:`~tether.records.NewEvent`, with the time each was made) and
makes the :class:`~tether.records.Event` a follower reads only when one reads it: most turns
(a caller waiting for the outcome) are followed by nobody, and a streamed reply is dozens of
events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping

from tether.errors import TurnNotFound
from tether.events import TURN_ENDED
from tether.records import Event, NewEvent, SessionKey
from tether.store.protocol import TurnReader

PARKED_POLL = 0.25
"""Seconds between store reads while a followed turn waits for a decision."""


class Feeds(dict[str, "TurnFeed"]):
    """The feeds of the turns running in this process, by turn id; a follower that comes
    before its turn's worker waits to be told it opened, rather than polling for it."""

    def __init__(self) -> None:
        super().__init__()
        self._openings: dict[str, tuple[asyncio.Event, int]] = {}

    def open(self, feed: TurnFeed) -> None:
        self[feed.turn_id] = feed
        opening = self._openings.pop(feed.turn_id, None)
        if opening is not None:
            opening[0].set()

    async def opened(self, turn_id: str, within: float) -> None:
        """Return when the turn's feed opens here, or after ``within`` seconds (the turn may
        run on another process, or end without running: the caller looks at the store)."""
        if turn_id in self:
            return
        event, waiting = self._openings.get(turn_id, (asyncio.Event(), 0))
        self._openings[turn_id] = (event, waiting + 1)
        try:
            async with asyncio.timeout(within):
                await event.wait()
        except TimeoutError:
            pass
        finally:
            current = self._openings.get(turn_id)
            if current is not None and current[0] is event:
                left = current[1] - 1
                if left:
                    self._openings[turn_id] = (event, left)
                else:
                    del self._openings[turn_id]


class TurnFeed:
    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.closed = False
        self._events: list[NewEvent] = []
        self._at: list[float] = []
        self._changed = asyncio.Event()
        self._waiting = 0

    def publish(self, event: NewEvent, at: float) -> None:
        """Add the turn's next event, made at ``at`` (epoch seconds)."""
        self._events.append(event)
        self._at.append(at)
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
        return self._events[0].seq if self._events else None

    async def follow(self, after_seq: int) -> AsyncIterator[Event]:
        """Events with ``seq > after_seq`` until the feed closes."""
        index = 0
        while True:
            while index < len(self._events):
                new, at = self._events[index], self._at[index]
                index += 1
                if new.seq > after_seq:
                    yield Event(self.turn_id, new.seq, new.type, new.data, at)
            if self.closed:
                return
            self._waiting += 1
            try:
                await self._changed.wait()
            finally:
                self._waiting -= 1


async def follow_turn(
    store: TurnReader,
    feeds: Mapping[str, TurnFeed],
    key: SessionKey,
    turn_id: str,
    after_seq: int = 0,
    *,
    closing: Callable[[], bool] = lambda: False,
) -> AsyncGenerator[Event, None]:
    """A turn's events after ``after_seq``: replayed from the store, then followed live.

    While the turn runs in this process its feed supplies the events not yet persisted; a turn
    running elsewhere (another process on the same store) is followed by polling the store.
    """
    last = after_seq
    saw_terminal = False
    while True:
        feed = feeds.get(turn_id)
        stored = await store.list_events(key, turn_id, after_seq=last)
        if not stored and await store.get_turn(key, turn_id) is None:
            raise TurnNotFound("turn not found")
        for event in stored:
            if feed is not None and feed.first_seq is not None and event.seq >= feed.first_seq:
                break  # the feed has these, and the ones not yet persisted
            yield event
            last = event.seq
            if event.type == TURN_ENDED:
                return
        if feed is not None:
            async for event in feed.follow(last):
                yield event
                last = event.seq
                saw_terminal = saw_terminal or event.type == TURN_ENDED
            if saw_terminal:
                return
            continue
        turn = await store.get_turn(key, turn_id)
        if turn is not None and turn.ended:
            # A resume id past the persisted events (those died with a crashed process):
            # the terminal event is still owed to the client.
            tail = await store.list_events(key, turn_id, after_seq=last)
            if not tail:
                ended = [e for e in await store.list_events(key, turn_id) if e.type == TURN_ENDED]
                for e in ended:
                    yield e
                return
            continue
        if closing():
            # Queued here, but this process takes no more turns: end the stream cleanly,
            # without a terminal event, so the client re-attaches (Last-Event-ID) to
            # whichever process runs the turn, instead of being cut off at exit.
            return
        # A turn parked on a decision may wait minutes: look less often meanwhile (a decision
        # made here starts a feed, which wakes this at once, as does the start of a turn queued
        # here; the look at the store is for turns another process runs).
        parked = turn is not None and turn.status == "awaiting_input"
        wait = PARKED_POLL if parked else 0.05
        if isinstance(feeds, Feeds):
            await feeds.opened(turn_id, wait)
        else:
            await asyncio.sleep(wait)
