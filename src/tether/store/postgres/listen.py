"""Cancel requests and turns queued elsewhere, announced by ``LISTEN/NOTIFY``: the PostgreSQL
store's feed.

A request is written and ``pg_notify`` is called in one transaction (see ``request_cancel``),
so the notification is delivered on commit and the owner never reads a request that is not
yet visible; so is a turn queued on a session another process holds the lease of
(``tether_enqueue``, migration 14), or freed to run there (a waiting turn ended, a decided
one queued again: ``steps.notify_holder``). The owning process keeps one listener connection
of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg  # type: ignore[import-untyped]

from tether.records import SessionKey
from tether.store.postgres import queries as q
from tether.store.postgres.connection import DRIVER_ERRORS, Connection, translate

LISTENER_NAME = "tether-cancel-listener"
"""How the cancel listener's connection shows in pg_stat_activity."""
PROBE_INTERVAL = 5.0
"""Seconds between probes of an idle listener: a silent network drop does not close a socket."""


class CancelListener(Connection):
    async def listen_cancels(
        self,
        heard: Callable[[str], None],
        ready: Callable[[], None],
        queued: Callable[[SessionKey | None], None] | None = None,
    ) -> None:
        """Call ``heard(turn_id)`` for each cancel request any process makes, and ``queued(key)``
        for each turn queued (or freed to run) on a session whose lease another process than
        the submitter's holds (``queued(None)``: a session whose key the notification could not
        carry), until the link drops.

        A connection of its own, outside the pool: a pooled connection is reset (``UNLISTEN *``)
        whenever it goes back. Returns when PostgreSQL closes the connection (a restart) and
        raises :class:`StoreError` when it cannot connect; the caller listens again.
        """
        try:
            conn = await asyncpg.connect(
                self.url,
                timeout=self._timeout,
                server_settings={"application_name": LISTENER_NAME},
            )
        except DRIVER_ERRORS as exc:
            translate(exc)
        lost = asyncio.Event()

        def on_notify(_c: object, _pid: int, _channel: str, payload: str) -> None:
            heard(payload)

        def on_queued(_c: object, _pid: int, _channel: str, payload: str) -> None:
            parts = payload.split("\x1f")
            if queued is not None:
                # Empty: a key too long or too odd for a payload; None asks for every one.
                queued(SessionKey(*parts) if len(parts) == 3 else None)

        try:
            conn.add_termination_listener(lambda _c: lost.set())
            await conn.add_listener(q.CANCEL_CHANNEL, on_notify)
            if queued is not None:
                await conn.add_listener(q.QUEUED_CHANNEL, on_queued)
            ready()
            while not lost.is_set() and not conn.is_closed():
                try:
                    await asyncio.wait_for(lost.wait(), timeout=PROBE_INTERVAL)
                except TimeoutError:
                    await conn.fetchval("SELECT 1", timeout=self._timeout)
        except DRIVER_ERRORS as exc:
            translate(exc)
        finally:
            conn.terminate()
