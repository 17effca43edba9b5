"""uvicorn's server without its tenth-of-a-second tick.

``uvicorn.Server.main_loop`` wakes the event loop ten times a second to look at ``should_exit``
(and, every tenth time, to renew the ``date`` header). On a server with nothing to do that was
most of what it did (bench/idle.py: ~2 ms of CPU a second for a bare uvicorn app), and a
process woken from sleep runs its next piece of work slower. Here the loop wakes once a second
for the header, and at once when ``should_exit`` is set — by uvicorn's signal handler, by a
test, by whoever stops a server running in a thread — because setting it wakes the loop.
(``limit_max_requests``, which tether does not set, is noticed within a second, not 0.1 s.)
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

TICK = 1.0
"""Seconds between ticks: the ``date`` header is to the second (uvicorn renews it every tenth
tick of 0.1 s)."""


class QuietServer(uvicorn.Server):
    _exit_wanted = False
    _exit_event: asyncio.Event | None = None
    _exit_loop: asyncio.AbstractEventLoop | None = None

    # uvicorn reads and sets ``should_exit`` as a plain attribute; a property lets setting it
    # wake ``main_loop`` from any thread (or from a signal handler) instead of at its next tick.
    @property
    def should_exit(self) -> bool:
        return self._exit_wanted

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_wanted = value
        loop, event = self._exit_loop, self._exit_event
        if value and loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        self._exit_loop = asyncio.get_running_loop()
        self._exit_event = event = asyncio.Event()
        try:
            ticks = 0
            should_exit = await self.on_tick(ticks)
            while not should_exit:
                # on_tick renews the date header when its counter is a multiple of 10.
                ticks = (ticks + 10) % 864_000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), TICK)
                # Cleared before on_tick reads the flag: a set that comes later (on this loop,
                # where the setter's wake-up runs) is seen at the next wait, none is lost, and
                # a flag set then unset does not leave the loop spinning.
                event.clear()
                should_exit = await self.on_tick(ticks)
        finally:
            self._exit_loop = self._exit_event = None
