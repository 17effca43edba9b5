"""The scheduler's background chores: lease heartbeats, cancel requests, sweeping, orphans.

Each runs as one task per process for as long as the scheduler does, and each tolerates a
failing store (it logs and tries again on its next round) so a store outage never kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from tether.records import Lease, SessionKey
from tether.scheduler.local import Running, RunningTurn
from tether.scheduler.news import StoreNews
from tether.store.capabilities import CancelFeed, ChangeCounter
from tether.store.protocol import DecisionStore, LeaseStore, Maintenance, TurnLog

log = logging.getLogger("tether.scheduler")


async def heartbeat(
    store: LeaseStore,
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
            if lease.key in kept_keys:
                continue
            now = leases.get(lease.key)
            if now is None or now.token != lease.token:
                # Given up, or given up and taken again, while the renewal was on its way: the
                # turn running now runs under the new lease, which this renewal never asked about.
                continue
            log.warning("lost the lease of a session; stopping its turn")
            for run in list(running.values()):
                if run.turn.key == lease.key:
                    run.ctx.request_cancel("failed", "lease_lost")


async def watch_cancels(
    store: TurnLog,
    running: Mapping[str, RunningTurn],
    interval: float,
    *,
    fallback_interval: float = 1.0,
    queued: Callable[[SessionKey | None], None] | None = None,
    feed: Callable[[bool], None] | None = None,
) -> None:
    """Apply cancel/interrupt requests other processes left in the store for our turns.

    A request made in this process reaches its turn directly (:meth:`Scheduler.cancel`); this
    is for the others. With a store that announces requests (:class:`CancelFeed`), a request
    for one of our turns wakes this at once and the store is polled only every
    ``fallback_interval`` (a request made while the listener was reconnecting is still found).
    Otherwise, with a :class:`ChangeCounter` that other processes' commits ring (SQLite's
    doorbell), it looks at the data version only when rung (or every ``fallback_interval``),
    and reads the requests only when it moved: a turn waiting on its model costs nothing
    meanwhile. A counter nobody rings is looked at every ``interval``, a store with neither
    read every ``interval``.

    The same feed announces turns other processes queue on sessions this one holds the lease
    of: ``queued(key)`` for each, and ``feed(True)`` / ``feed(False)`` as the feed comes up or
    goes down (while it is down, lingering workers look at the queue themselves).
    """
    wake = asyncio.Event()
    listening = asyncio.Event()
    listener: asyncio.Task[None] | None = None
    counter: ChangeCounter | None = None
    if isinstance(store, CancelFeed):
        listener = asyncio.create_task(
            _listen(store, running, wake, listening, queued, feed), name="tether-listen"
        )
    elif isinstance(store, ChangeCounter):
        counter = store
    seen: int | None = None
    last_read = 0.0
    news = StoreNews(counter)
    try:
        while True:
            if not running and isinstance(running, Running):
                # Nothing of ours to end: no timer while idle. The first turn to start here
                # wakes this (a request for it is then read at once, unless the store would
                # have been rung for it).
                await running.started()
                if counter is None or counter.heard() is None:
                    seen = None
            rings = counter.heard() if counter is not None else None
            if rings is not None:
                # Every commit of another process rings the store: until one does, nobody can
                # have asked to end a turn of ours, so a turn waiting on its model costs no
                # look (rings before this first wait are old news). A look every
                # fallback_interval still finds a writer that does not ring; a busy writer's
                # stream of rings is looked into no more often than every interval.
                if news.mark is None:
                    news.mark = rings
                await news.wait(None, interval, fallback=fallback_interval)
            else:
                timeout = fallback_interval if listening.is_set() else interval
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
                wake.clear()
            if not running:
                continue  # nothing of ours to end: no store reads while idle
            try:
                if counter is not None:
                    news.looking()  # before the look: a ring it misses wakes the next wait
                    # Read before the requests: a request committed after this moves it again.
                    version = await counter.data_version()
                    due = time.monotonic() - last_read >= fallback_interval
                    if version == seen and not due:
                        continue
                    seen = version
                last_read = time.monotonic()
                requests = await store.cancel_requests(list(running))
            except Exception:
                log.exception("reading cancel requests failed; retrying")
                seen = None
                continue
            for turn_id, (status, reason) in requests.items():
                run = running.get(turn_id)
                if run is not None:
                    run.ctx.request_cancel(status, reason)
    finally:
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener


async def _listen(
    store: CancelFeed,
    running: Mapping[str, RunningTurn],
    wake: asyncio.Event,
    listening: asyncio.Event,
    queued: Callable[[SessionKey | None], None] | None = None,
    feed: Callable[[bool], None] | None = None,
) -> None:
    """Keep a cancel listener up, reconnecting after the store goes away and comes back."""

    loop = asyncio.get_running_loop()

    def wake_if_ours(turn_id: str) -> None:
        if turn_id in running:
            wake.set()

    def heard(turn_id: str) -> None:
        wake_if_ours(turn_id)
        # A request can overtake the reply to our own start of that turn (the request needs the
        # turn committed as running; we register it once the commit's reply is back): look again
        # shortly. Beyond that the fallback poll finds it.
        for delay in (0.05, 0.25):
            loop.call_later(delay, wake_if_ours, turn_id)

    def ready() -> None:
        listening.set()
        wake.set()  # a request made while we were not listening: look now
        if feed is not None:
            feed(True)

    while True:
        try:
            await store.listen_cancels(heard, ready, queued)
            log.warning("the cancel listener's connection closed; listening again")
        except Exception as exc:
            log.warning("cannot listen for cancel requests (%s); polling until it can", exc)
        finally:
            # Cancelled too (the scheduler closing): whoever lingers polls again.
            if listening.is_set() and feed is not None:
                feed(False)
        listening.clear()
        await asyncio.sleep(1.0)


async def sweep_expired(
    store: Maintenance,
    interval: Callable[[], float],
    gone: Callable[[Sequence[SessionKey]], Awaitable[None]],
) -> None:
    """Delete idle sessions past their TTL (any node may; the store keeps it safe), then what
    they had outside the store (``gone``: their workspaces)."""
    while True:
        await asyncio.sleep(interval())
        try:
            swept = await store.sweep_expired(time.time())
        except Exception:
            log.exception("sweeping expired sessions failed; retrying later")
            continue
        if not swept:
            continue
        log.info("swept %d expired sessions", len(swept))
        try:
            await gone(swept)
        except Exception:
            log.exception(
                "could not remove what %d swept sessions left outside the store", len(swept)
            )


async def adopt_orphans(
    store: Maintenance,
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


DECISION_SWEEP_MAX = 5.0
"""Longest sleep of the deadline sweep when no deadline is known (one cheap read: a decision
asked in another process has its deadline found within this). It bounds how late a decision
expires when the process that asked it died: no other process knew its deadline."""


async def expire_decisions(
    store: DecisionStore,
    kick: Callable[[SessionKey], None],
    asked: asyncio.Event,
) -> None:
    """End pending decisions whose deadline passed, on whichever process gets there first
    (each ends once), and wake their sessions so the turns go on with a refusal.

    Sleeps until the earliest deadline it knows of; ``asked`` is set when this process parks a
    turn, so a shorter deadline than the one it sleeps towards is seen at once.
    """
    while True:
        asked.clear()  # before the read: a park after it is not missed
        try:
            for key in await store.expire_decisions(time.time()):
                kick(key)
            nearest = await store.next_decision_deadline()
        except Exception:
            log.exception("decision deadline sweep failed; retrying")
            nearest = None
        wait = DECISION_SWEEP_MAX if nearest is None else nearest - time.time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(max(wait, 0.01), DECISION_SWEEP_MAX)):
                await asked.wait()
