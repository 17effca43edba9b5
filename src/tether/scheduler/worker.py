"""The per-session worker: take the lease, recover, run the queue in order, linger, let go.

Each session with work has at most one worker task in this process. The worker takes the
session's lease (a fencing token incremented on every acquisition), ends any turn a dead owner
left ``running`` (``failed``/``owner_lost``), then runs queued turns in ``seq`` order until none
is left, and releases the lease. Every write a turn makes is fenced by that lease in the store
itself, so a worker that lost its lease (paused past expiry, say) cannot write, even if it does
not know yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from tether.errors import SessionNotFound, StaleLease, TurnNotNext
from tether.records import Lease, SessionKey, Turn
from tether.scheduler.local import Local
from tether.scheduler.owners import owner_is_dead
from tether.scheduler.runner import TurnRunner
from tether.store.protocol import (
    ChangeCounter,
    FencedWrites,
    LeaseStore,
    SessionReader,
    TurnReader,
)

log = logging.getLogger("tether.scheduler")

LINGER_POLL = 0.05
"""Seconds between looks at the store for turns accepted elsewhere while a lease lingers."""


def runnable(active: list[Turn]) -> Turn | None:
    """The turn to run next: the session's first active turn, if it is queued (new, or decided
    and going on). Behind a turn parked on a decision nothing runs: order is the session's."""
    if active and active[0].status == "queued":
        return active[0]
    return None


class WorkerStore(LeaseStore, FencedWrites, TurnReader, SessionReader, Protocol):
    """What a session worker needs of the store: the lease, recovery, the queue, the agent."""


class Workers:
    def __init__(
        self,
        store: WorkerStore,
        local: Local,
        runner: TurnRunner,
        *,
        owner: str,
        lease_ttl: float,
        linger: float,
    ) -> None:
        self._store = store
        self._local = local
        self._runner = runner
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.linger = linger
        self._agent_of: dict[SessionKey, str] = {}
        """Each leased session's own agent ('' once gone), for the turns that name none."""
        self._ran_to: dict[SessionKey, int] = {}
        """The seq of the last turn this process's worker of the session took up: a handed turn
        at or before it was found in the queue before it was handed (and is stale)."""

    def kick(self, key: SessionKey, turn: Turn | None = None) -> None:
        """Make sure a worker will look at ``key``'s queue (start one, or wake the one there);
        ``turn``, just queued here, is handed to it to start without a read of the queue."""
        local = self._local
        if turn is not None:
            local.handed.setdefault(key, turn)  # the earliest is the likelier to be next
        worker = local.workers.get(key)
        if worker is not None and not worker.done():
            local.dirty.add(key)  # the worker re-reads the queue before it gives up the session
            kicked = local.kicked.get(key)
            if kicked is not None:
                kicked.set()
            return
        local.workers[key] = asyncio.create_task(self._work(key), name="tether-worker")

    async def _work(self, key: SessionKey) -> None:
        local = self._local
        try:
            while True:
                lease = await self._acquire(key)
                if lease is None:
                    return  # nothing left to do, or the session is gone
                local.leases[key] = lease
                try:
                    await self._recover(lease)
                    await self._drain(key, lease)
                    while await self._linger(key):
                        await self._drain(key, lease)
                except StaleLease:
                    log.warning("lost the lease of a session mid-turn; stopped without writing")
                    # Look again under a new lease (or wait for whoever holds it now): the
                    # turn that found the lease stale is still queued. A session deleted and
                    # made again under the same id while this lease lingered gets here too.
                    local.dirty.add(key)
                finally:
                    local.leases.pop(key, None)
                    self._agent_of.pop(key, None)
                    local.history.forget(key)
                    await self._release(lease)
                # No await between this check and leaving workers: a submit that lands after
                # it sees no worker and starts a new one; one that landed before set dirty.
                if key in local.dirty:
                    local.dirty.discard(key)
                    continue
                self._gone(key)
                local.principals.pop(key, None)
                return
        except asyncio.CancelledError:
            self._gone(key)
            raise
        except Exception:
            log.exception("session worker failed")
            self._gone(key)

    def _gone(self, key: SessionKey) -> None:
        """This process's worker of ``key`` has ended: forget what it knew of the session."""
        self._local.workers.pop(key, None)
        self._local.handed.pop(key, None)
        self._ran_to.pop(key, None)

    async def _acquire(self, key: SessionKey) -> Lease | None:
        delay = 0.02
        while True:
            try:
                lease = await self._store.acquire_lease(key, self.owner, self.lease_ttl)
                if lease is None:
                    holder = await self._store.lease_holder(key)
                    if holder is not None and owner_is_dead(holder):
                        lease = await self._take_over(key, holder)
            except SessionNotFound:
                return None
            if lease is not None:
                return lease
            # Another live process holds the session; it will run the queue. Wait while there
            # is still work, in case it dies or releases the lease with turns left.
            active = await self._store.active_turns(key)
            if not active or active[0].status == "awaiting_input":
                return None  # nothing left, or parked on a decision: nothing to run for now
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _take_over(self, key: SessionKey, holder: str) -> Lease | None:
        lease = await self._store.take_over_lease(key, self.owner, self.lease_ttl, holder)
        if lease is not None:
            log.warning("took over the lease of a dead process (%s)", holder)
        return lease

    async def _release(self, lease: Lease) -> None:
        try:
            await self._store.release_lease(lease)
        except Exception:
            log.exception("could not release a lease; it will expire")

    async def _recover(self, lease: Lease) -> None:
        """End what a dead owner left running. Once per lease: while this worker holds it, no
        other process runs the session's turns, so none can be left behind meanwhile."""
        for lost in await self._store.recover(lease):
            log.warning("turn %s ended failed/owner_lost: its process died", lost.id)
            self._local.resolve(lost)

    async def _drain(self, key: SessionKey, lease: Lease) -> None:
        local = self._local
        while True:
            local.dirty.discard(key)
            # A turn submitted here is most often the next one: start it without reading the
            # queue. The store refuses the start if an earlier turn (accepted by another
            # process, or parked) is still active, and then the queue says what comes first.
            turn = local.handed.pop(key, None)
            if turn is None or turn.seq <= self._ran_to.get(key, 0):
                turn = runnable(await self._store.active_turns(key))
            if turn is None or local.closing:
                return
            self._ran_to[key] = max(turn.seq, self._ran_to.get(key, 0))
            if turn.agent is None and key not in self._agent_of:
                # Read once per lease: a session's own agent does not change under it.
                record = await self._store.get_session(key)
                self._agent_of[key] = record.agent if record is not None else ""
            agent = turn.agent.name if turn.agent else self._agent_of[key]
            with contextlib.suppress(TurnNotNext):
                await self._runner.run(lease, turn, agent)

    def _closing(self) -> bool:
        # A call, not the attribute: close() flips it while _linger awaits, and a type checker
        # that narrowed the attribute before the await would call the re-read unreachable.
        return self._local.closing

    async def _linger(self, key: SessionKey) -> bool:
        """Keep the lease a moment after the queue empties; True if a new turn came in.

        A conversation's next turn often follows within moments: holding on saves taking and
        giving up the lease (two write transactions) per turn. Turns submitted in this process
        wake the worker at once; turns accepted by another process (a load balancer spreading
        one session over several nodes) are seen by a look at the store every LINGER_POLL, so
        they do not wait for the linger to run out (with a :class:`ChangeCounter`, a look at
        the queue only when another process wrote).
        """
        local = self._local
        if local.closing or self.linger <= 0:
            return False
        if key in local.dirty:
            return True
        kicked = local.kicked[key] = asyncio.Event()
        deadline = time.monotonic() + self.linger
        # With a store that says when another process wrote (SQLite), look at the queue only
        # then: a turn accepted here kicks this directly. The first look always reads it (a
        # turn accepted elsewhere before the first version read is seen by that read).
        counter = self._store if isinstance(self._store, ChangeCounter) else None
        seen: int | None = None
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, LINGER_POLL)):
                        await kicked.wait()
                closing = self._closing()  # re-read: close() may have run while we waited
                if key in local.dirty:
                    return not closing
                if closing:
                    return False  # close() set the event to end lingering
                if counter is not None:
                    version = await counter.data_version()
                    if version == seen:
                        continue
                    seen = version
                try:
                    active = await self._store.active_turns(key)
                except SessionNotFound:
                    return False  # deleted (or forgotten) while we lingered
                if runnable(active) is not None:
                    return True  # accepted (or decided) elsewhere: run it while we hold it
        finally:
            local.kicked.pop(key, None)
