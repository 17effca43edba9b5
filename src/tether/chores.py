"""The scheduler's background chores: lease heartbeats, cancel requests, sweeping, orphans.

Each runs as one task per process for as long as the scheduler does, and each tolerates a
failing store (it logs and tries again on its next round) so a store outage never kills it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tether.loop.context import TurnContext
from tether.records import Lease, SessionKey, Turn
from tether.store.base import Store

log = logging.getLogger("tether.scheduler")


@dataclass
class RunningTurn:
    """A turn running in this process, with the context that can stop it."""

    turn: Turn
    ctx: TurnContext


async def heartbeat(
    store: Store,
    leases: Mapping[SessionKey, Lease],
    running: Mapping[str, RunningTurn],
    ttl: float,
) -> None:
    """Renew every lease this process holds; stop the turn under any lease it lost."""
    interval = max(ttl / 3, 0.05)
    while True:
        await asyncio.sleep(interval)
        held = list(leases.values())
        if not held:
            continue
        try:
            kept = await store.renew_leases(held, ttl)
        except Exception:
            log.exception("lease renewal failed; retrying")
            continue
        kept_keys = {lease.key for lease in kept}
        for lease in held:
            if lease.key not in kept_keys:
                log.warning("lost the lease of a session; stopping its turn")
                for run in list(running.values()):
                    if run.turn.key == lease.key:
                        run.ctx.request_cancel("failed", "lease_lost")


async def watch_cancels(store: Store, running: Mapping[str, RunningTurn], interval: float) -> None:
    """Apply cancel/interrupt requests other processes left in the store for our turns."""
    while True:
        await asyncio.sleep(interval)
        if not running:
            continue  # nothing of ours to end: no store reads while idle
        try:
            requests = await store.cancel_requests(list(running))
        except Exception:
            log.exception("reading cancel requests failed; retrying")
            continue
        for turn_id, (status, reason) in requests.items():
            run = running.get(turn_id)
            if run is not None:
                run.ctx.request_cancel(status, reason)


async def sweep_expired(store: Store, interval: Callable[[], float]) -> None:
    """Delete idle sessions past their TTL (any node may; the store keeps it safe)."""
    while True:
        await asyncio.sleep(interval())
        try:
            swept = await store.sweep_expired(time.time())
        except Exception:
            log.exception("sweeping expired sessions failed; retrying later")
            continue
        if swept:
            log.info("swept %d expired sessions", swept)


async def adopt_orphans(
    store: Store,
    workers: Mapping[SessionKey, object],
    kick: Callable[[SessionKey], None],
    ttl: float,
    closing: Callable[[], bool],
) -> None:
    """Take up work nobody is doing: turns whose session has no live lease.

    That is what a dead process leaves behind when no new request comes to its sessions, or
    what a worker that gave up during a store outage leaves: without this, such a turn would
    stay ``running`` until the session's next request.
    """
    while True:
        await asyncio.sleep(max(ttl / 2, 0.05))
        if closing():
            return
        try:
            orphans = await store.sessions_needing_work(unowned_at=time.time())
        except Exception:
            log.warning("looking for orphaned turns failed; retrying", exc_info=True)
            continue
        for key in orphans:
            if key not in workers:
                kick(key)
