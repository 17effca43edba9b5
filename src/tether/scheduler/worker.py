"""The per-session worker: take the lease, recover, run the queue in order, linger, let go.

Each session with work has at most one worker task in this process. The worker takes the
session's lease (a fencing token incremented on every acquisition), ends any turn a dead owner
left ``running`` (``failed``/``owner_lost``), then runs queued turns in ``seq`` order until none
is left, and releases the lease (with the last turn's ending when the store can and nothing
here waits for the lease: :meth:`Workers._let_go`). Every write a turn makes is fenced by that
lease in the store itself, so a worker that lost its lease (paused past expiry, say) cannot
write, even if it does not know yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Protocol

from tether.errors import SessionNotFound, StaleLease, TurnNotNext
from tether.records import Lease, SessionKey, Turn
from tether.scheduler.linger import Lingering, runnable
from tether.scheduler.local import Local
from tether.scheduler.owners import owner_is_dead
from tether.scheduler.runner import TurnRunner
from tether.store.protocol import FencedWrites, LeaseStore, SessionReader, TurnReader

log = logging.getLogger("tether.scheduler")


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
        self._lingering = Lingering(store, local, seconds=linger)
        self._agent_of: dict[SessionKey, str] = {}
        """Each leased session's own agent ('' once gone), for the turns that name none."""
        self._ran_to: dict[SessionKey, int] = {}
        """The seq of the last turn this process's worker of the session took up: a handed turn
        at or before it was found in the queue before it was handed (and is stale)."""
        self._looked: dict[SessionKey, tuple[str, int]] = {}
        """When each leased session's queue was last read and held nothing to run (the store's
        :meth:`news` then): while that holds, every turn queued since was handed to the worker
        or announced (a feed that stayed up), or nobody else has committed (a data version that
        has not moved), so the queue needs no new look."""

    @property
    def linger(self) -> float:
        """Seconds a worker keeps its lease once the queue is empty (:mod:`.linger`)."""
        return self._lingering.seconds

    @linger.setter
    def linger(self, seconds: float) -> None:
        self._lingering.seconds = seconds

    def news(self) -> tuple[str, int] | None:
        """What says whether turns were queued elsewhere since (:meth:`Lingering.news`)."""
        return self._lingering.news()

    async def stop(self) -> None:
        """Stop watching for lingering sessions (the scheduler closes)."""
        await self._lingering.stop()

    def feed_changed(self, up: bool) -> None:
        """The store's feed came up (or went down). Up, every session held here looks at its
        queue once: a turn queued elsewhere while the feed was down was announced to nobody."""
        self._lingering.feed_changed(up)
        if up:
            for key in list(self._local.leases):
                self.kick(key)

    def heard_queued(self, key: SessionKey | None) -> None:
        """Another process queued a turn on ``key`` (or freed one to run): wake its worker if
        this process holds it. None: a session the notice could not name, so every one."""
        for held in [key] if key is not None else list(self._local.leases):
            if held in self._local.leases:
                self.kick(held)

    def kick(
        self,
        key: SessionKey,
        turn: Turn | None = None,
        lease: Lease | None = None,
        news: tuple[str, int] | None = None,
    ) -> None:
        """Make sure a worker will look at ``key``'s queue (start one, or wake the one there);
        ``turn``, just queued here, is handed to it to start without a read of the queue, and
        ``lease``, taken with it, to run it under (``news``: :meth:`news` before that)."""
        local = self._local
        if lease is not None:
            local.granted[key] = (lease, news)
        if turn is not None:
            local.handed.setdefault(key, turn)  # the earliest is the likelier to be next
        if turn is None or local.handed.get(key) is not turn:
            # News the handed turn does not cover (a second turn queued here, one announced
            # from elsewhere, a decision): the worker reads the queue before it gives up.
            self._looked.pop(key, None)
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
                acquired = await self._acquire(key)
                if acquired is None:
                    if key in local.granted:
                        continue  # taken for it here as it gave up: run under that one
                    self._gone(key)  # nothing left to do, or the session is gone
                    return
                lease, news = acquired
                local.leases[key] = lease
                kept = released = False
                try:
                    if await self._recover(lease):
                        local.history.forget(key)  # recovery wrote to the history
                    else:
                        local.history.adopt(lease)
                    self._queue_seen(key, lease, news)
                    released = await self._drain(key, lease)
                    while not released and await self._linger(key, lease):
                        released = await self._drain(key, lease)
                    kept = True
                except StaleLease:
                    log.warning("lost the lease of a session mid-turn; stopped without writing")
                    # Look again under a new lease (or wait for whoever holds it now): the
                    # turn that found the lease stale is still queued. A session deleted and
                    # made again under the same id while this lease lingered gets here too.
                    local.dirty.add(key)
                finally:
                    local.leases.pop(key, None)
                    # An admission made under the lease (Local.claims) settles before the lease
                    # goes (after _linger that is done; after a failure it may be in flight).
                    while (claim := local.claims.get(key)) is not None:
                        await claim.wait()
                    # The agent noted under this lease (one noted under the next lease, which
                    # an admission may have taken once the ending let this one go, stays).
                    noted = local.agents.get(key)
                    if noted is not None and noted[0] is lease:
                        del local.agents[key]
                    self._agent_of.pop(key, None)
                    self._looked.pop(key, None)  # a new lease reads its queue afresh
                    if kept:
                        local.history.release(lease)  # for the session's next lease here
                    else:
                        local.history.forget(key)
                    if not released:
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
        except SessionNotFound:
            # Deleted (or expired and swept) under the worker, after its turns were ended:
            # nothing is left to work on, which is no failure.
            log.info("session %s is gone; its worker stops", key.session_id)
            self._gone(key)
        except Exception:
            log.exception("session worker failed")
            self._gone(key)

    def _gone(self, key: SessionKey) -> None:
        """This process's worker of ``key`` has ended: forget what it knew of the session (a
        lease taken for it and not used, after a failure, runs out by itself)."""
        local = self._local
        local.workers.pop(key, None)
        local.granted.pop(key, None)
        local.started.pop(key, None)
        local.agents.pop(key, None)
        for turn_id in [t for t, (k, _, _) in local.asked.items() if k == key]:
            del local.asked[turn_id]
        local.handed.pop(key, None)
        self._ran_to.pop(key, None)

    async def _acquire(self, key: SessionKey) -> tuple[Lease, tuple[str, int] | None] | None:
        """The session's lease, with the store's news from before it was taken: one a turn's
        admission here took for this worker (:attr:`Local.granted`), or one acquired (or taken
        over from a dead owner). None when the session is gone, or another live process holds
        it and nothing here is left to run."""
        local = self._local
        delay = 0.02
        while True:
            granted = local.granted.pop(key, None)
            if granted is not None:
                return granted  # taken as a turn was admitted: no acquisition
            if local.closing:
                return None  # the holder runs the queue (close() woke this to stop waiting)
            news = self.news()  # before the grant: what the lease's look at the queue saw
            try:
                lease = await self._store.acquire_lease(key, self.owner, self.lease_ttl)
                if lease is None:
                    holder = await self._store.lease_holder(key)
                    if holder is not None and owner_is_dead(holder):
                        lease = await self._take_over(key, holder)
            except SessionNotFound:
                return None
            if lease is not None:
                return lease, news
            # Another live process holds the session; it will run the queue. Wait while there
            # is still work, in case it dies or releases the lease with turns left; or until
            # an admission here takes the lease as it is released (it kicks this worker).
            active = await self._store.active_turns(key)
            if not active or active[0].status == "awaiting_input":
                return None  # nothing left, or parked on a decision: nothing to run for now
            if key in local.granted:
                continue  # taken for this worker while it looked
            kicked = local.kicked[key] = asyncio.Event()  # no await since the look: none missed
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await kicked.wait()
            finally:
                if local.kicked.get(key) is kicked:
                    del local.kicked[key]
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

    async def _recover(self, lease: Lease) -> bool:
        """End what a dead owner left running; True if there was any. Once per lease: while
        this worker holds it, no other process runs the session's turns, so none can be left
        behind meanwhile."""
        if lease.left_running is False:
            return False  # the store looked as it granted the lease: nothing to end
        lost = await self._store.recover(lease)
        for turn in lost:
            log.warning("turn %s ended failed/owner_lost: its process died", turn.id)
            self._local.resolve(turn)
        return bool(lost)

    def _queue_seen(self, key: SessionKey, lease: Lease, news: tuple[str, int] | None) -> None:
        """The store told the lease's queue as it granted it (SQLite): when it held nothing but
        the turn handed to the worker, the read after that turn is saved, as after a read that
        found the queue empty (no news since ``news``, noted before the grant)."""
        if lease.queue is None or news is None:
            return
        handed = self._local.handed.get(key)
        started = self._local.started_under(key, lease)
        ids = {t.id for t in (handed, started) if t is not None}
        if all(turn_id in ids for turn_id in lease.queue):
            self._looked[key] = news

    async def _drain(self, key: SessionKey, lease: Lease) -> bool:
        """Run the session's turns while there are any; True if the last one's ending gave
        the lease up (:meth:`_let_go`)."""
        local = self._local
        let_go = self._let_go(key, lease)
        while True:
            dirty = key in local.dirty
            local.dirty.discard(key)
            if self._local.started_under(key, lease) is not None:
                # Started as it was admitted, under this lease: it runs first, even when the
                # process is closing (it shows running; left so, it would end owner_lost).
                first, admitted = local.started.pop(key)
                self._ran_to[key] = max(first.seq, self._ran_to.get(key, 0))
                agent = await self._agent(key, first)
                if await self._runner.run(lease, first, agent, admitted, let_go):
                    return True
                self._kept(key, lease)
                continue
            # A turn submitted here is most often the next one: start it without reading the
            # queue. The store refuses the start if an earlier turn (accepted by another
            # process, or parked) is still active, and then the queue says what comes first.
            turn = local.handed.pop(key, None)
            news = self.news()
            if turn is None and not dirty and news is not None and self._looked.get(key) == news:
                # Read under this lease, and nothing handed, announced or committed elsewhere
                # since: the queue holds nothing new (the read after each turn, saved).
                return False
            if turn is None or turn.seq <= self._ran_to.get(key, 0):
                turn = runnable(await self._store.active_turns(key))
                if turn is None and news is not None:
                    self._looked[key] = news  # noted before the read: nothing it missed
            if turn is None or local.closing:
                return False
            self._ran_to[key] = max(turn.seq, self._ran_to.get(key, 0))
            try:
                if await self._runner.run(lease, turn, await self._agent(key, turn), None, let_go):
                    return True
            except TurnNotNext:
                self._looked.pop(key, None)  # an earlier turn is active: the queue says which
            self._kept(key, lease)

    def _kept(self, key: SessionKey, lease: Lease) -> None:
        """After a turn that did not give the lease up: if its ending offered to (and the
        store kept the lease, a turn of the session being left active), hold it here again,
        and read the queue next (the turn left may be one queued elsewhere and announced to
        nobody while the lease was not held here)."""
        local = self._local
        if local.leases.get(key) is not lease:
            local.leases[key] = lease
            self._looked.pop(key, None)

    def _let_go(self, key: SessionKey, lease: Lease) -> Callable[[], bool]:
        """What a turn's ending asks of the worker (when the store can give the lease up with
        it): whether to. Yes when nothing here waits to run under the lease and no linger is
        wanted; the lease is then no longer held here as far as this process goes, so a turn
        submitted while the ending is written is admitted the usual way (the store takes the
        lease for it once the ending let it go, or queues it behind the lease kept for a turn
        that is still active, which the worker then runs: :meth:`_drain` puts it back)."""
        local = self._local

        def when() -> bool:
            if (
                self._lingering.seconds > 0
                or local.leases.get(key) is not lease
                or key in local.dirty
                or key in local.handed
                or key in local.claims
                or key in local.granted
                or local.started_under(key, lease) is not None
            ):
                return False
            del local.leases[key]
            return True

        return when

    async def _agent(self, key: SessionKey, turn: Turn) -> str:
        """The name of the agent ``turn`` was sent to: its own, or the session's."""
        if turn.agent is not None:
            return turn.agent.name
        if key not in self._agent_of:
            # Read once per lease: a session's own agent does not change under it.
            record = await self._store.get_session(key)
            self._agent_of[key] = record.agent if record is not None else ""
        return self._agent_of[key]

    async def _linger(self, key: SessionKey, lease: Lease) -> bool:
        """:meth:`Lingering.wait`; then, if a turn is being admitted under this lease to start
        at once (:attr:`Local.claims`), wait until it has settled. True if a turn came in.

        The caller gives the lease up (``local.leases``) with no await after this returns, so
        a submit that comes later finds no lease held here and queues its turn the usual way.
        """
        local = self._local
        looked = self._looked.get(key)
        # The store's data version when the queue was last found empty under this lease: only
        # a commit since is news.
        seen = looked[1] if looked is not None and looked[0] == "version" else None
        kept = await self._lingering.wait(key, lease, seen)
        while (claim := local.claims.get(key)) is not None:
            await claim.wait()
        return kept or local.started_under(key, lease) is not None

    def wake(self, key: SessionKey) -> None:
        """Wake ``key``'s worker if it lingers (an admission made under its lease settled)."""
        kicked = self._local.kicked.get(key)
        if kicked is not None:
            kicked.set()
