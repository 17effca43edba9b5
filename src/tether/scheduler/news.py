"""How a caller waiting on another process learns that it wrote: a ring, or a poll.

A caller in this process that waits for something another process does (a turn it runs, a
cancel it asks for) can only learn of it from the store. With a store whose other processes
ring it after each commit (SQLite's doorbell, :meth:`ChangeCounter.heard`), it waits for a
ring, and looks at the store only then: a turn that waits on its model elsewhere costs it
nothing. Without one, it looks every ``poll`` seconds, as it always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from tether.store.capabilities import ChangeCounter

FALLBACK = 1.0
"""With rings: a look this often anyway, for a writer that does not ring."""
BURST = 3
"""With rings: this many looks at once after a quiet spell, then one a poll."""


class StoreNews:
    """One waiting caller's view of other processes' writes."""

    def __init__(self, counter: ChangeCounter | None, mark: int | None = None) -> None:
        self.counter = counter
        self.mark = mark
        """The rings the store had heard before the caller's last look at it (None: not yet
        looked, or nobody rings it)."""
        # Looks owed to rings: a bucket of BURST, refilled at one a poll.
        self._tokens = float(BURST)
        self._stamp = time.monotonic()

    def looking(self) -> None:
        """Call just before a look at the store: a ring for a commit the look misses (it
        comes after the commit) wakes the next :meth:`wait`."""
        self.mark = self.counter.heard() if self.counter is not None else None

    async def wait(
        self, fut: asyncio.Future[Any] | None, poll: float, *, fallback: float | None = None
    ) -> None:
        """Until ``fut`` (if any) is done, or it is time to look again: with rings, a ring
        since the last look (under a busy writer's stream of rings, no more looks than a poll
        would make), or ``fallback`` seconds (FALLBACK) without one, or at once before a first
        look; without rings, ``poll`` seconds."""
        counter, mark = self.counter, self.mark
        if counter is not None and mark is None and counter.heard() is not None:
            return  # rung, but not looked yet: look now, and wait from there
        if counter is None or mark is None or counter.heard() is None:
            if fut is None:
                await asyncio.sleep(poll)
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll):
                    await asyncio.shield(fut)
            return
        hearing = asyncio.ensure_future(counter.hear(mark))
        try:
            waited = (hearing,) if fut is None else (fut, hearing)
            await asyncio.wait(
                waited,
                timeout=FALLBACK if fallback is None else fallback,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            hearing.cancel()
        if fut is not None and fut.done():
            return
        # The first rings after a quiet spell are looked into at once (the news a caller
        # waits for is often the second commit after its look); a stream of them, at one a
        # poll.
        now = time.monotonic()
        self._tokens = min(float(BURST), self._tokens + (now - self._stamp) / poll)
        self._stamp = now
        if self._tokens < 1.0:
            await asyncio.sleep((1.0 - self._tokens) * poll)
            self._tokens, self._stamp = 1.0, time.monotonic()
        self._tokens -= 1.0
