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
from tether.scheduler.news import StoreNews
from tether.scheduler.owners import owner_is_dead
from tether.scheduler.runner import TurnRunner
from tether.store.capabilities import ChangeCounter
from tether.store.protocol import FencedWrites, LeaseStore, SessionReader, TurnReader

log = logging.getLogger("tether.scheduler")

LINGER_POLL = 0.05
"""Seconds between looks at the store for turns accepted elsewhere while a lease lingers (with
a store other processes ring: a look only when rung, no more often than this)."""


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
        self._counter = store if isinstance(store, ChangeCounter) else None
        """The store as a :class:`ChangeCounter` (SQLite), looked up once, or None."""
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
        self._looked: dict[SessionKey, tuple[str, int]] = {}
        """When each leased session's queue was last read and held nothing to run (the store's
        :meth:`_news` then): while that holds, every turn queued since was handed to the worker
        or announced (a feed that stayed up), or nobody else has committed (a data version that
        has not moved), so the queue needs no new look."""
        self._polling: dict[SessionKey, int | None] = {}
        """The sessions lingering on a store's data version (SQLite), each with the version it
        last looked at its queue under: one task (:meth:`_watch_version`) reads the version for
        all of them and wakes those it has news for."""
        self._version: int | None = None
        """The data version :meth:`_watch_version` read last (None: unknown, or it failed)."""
        self._rings = StoreNews(self._counter)
        """When that watch looks next: rung by other processes' commits, or on a timer."""
        self._poller: asyncio.Task[None] | None = None
        """The task of :meth:`_watch_version`, while some session lingers on the version."""
        self._feed: int | None = None
        """While the store's feed announces turns queued elsewhere (:meth:`feed_changed`): how
        many times it has come up, so a linger can tell it stayed up; None while it is down."""
        self._feeds = 0

    def news(self) -> tuple[str, int] | None:
        """What says whether turns were queued elsewhere since: the feed while it is up, or
        the store's data version; None when the store says nothing (read every time)."""
        if self._feed is not None:
            return ("feed", self._feed)
        if self._counter is not None:
            return ("version", self._counter.seen_version())
        return None

    def _watch(self, key: SessionKey, seen: int | None) -> None:
        """``key`` lingers, having looked at its queue under data version ``seen``: make sure
        the version is watched for it."""
        self._polling[key] = seen
        counter, version, mark = self._counter, self._version, self._rings.mark
        if (
            counter is not None
            and version is not None
            and seen is not None
            and version > seen
            and mark is not None
            and counter.heard() == mark
        ):
            # The watch read a newer version than the queue was read under, and will not look
            # again until the next ring: the ring of that commit came before this linger did.
            kicked = self._local.kicked.get(key)
            if kicked is not None:
                kicked.set()
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._watch_version(), name="tether-linger-watch")

    async def _watch_version(self) -> None:
        """One look at the store's data version for all lingering sessions (it was one each):
        those whose queue may have changed since they looked are woken. With a store that other
        processes' commits ring, a look only when rung (:class:`StoreNews`); otherwise one
        every LINGER_POLL."""
        counter = self._counter
        assert counter is not None  # started only by lingers on a data version
        while True:
            await self._rings.wait(None, LINGER_POLL)
            if not self._polling or self._local.closing:
                return  # no await between this and the task's end: _watch starts a new one
            self._rings.looking()
            try:
                version: int | None = await counter.data_version()
            except Exception:
                version = None  # the lingering workers look at the store themselves
            self._version = version
            for key, seen in list(self._polling.items()):
                kicked = self._local.kicked.get(key)
                if kicked is not None and (version is None or version != seen):
                    kicked.set()

    async def stop(self) -> None:
        """Stop the version watch (the scheduler closes; no session lingers any more)."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    def feed_changed(self, up: bool) -> None:
        """The store's feed came up (or went down). Up, every session held here looks at its
        queue once: a turn queued elsewhere while the feed was down was announced to nobody."""
        if not up:
            self._feed = None
            for kicked in list(self._local.kicked.values()):
                kicked.set()  # lingering workers that trusted the feed look for themselves now
            return
        self._feeds += 1
        self._feed = self._feeds
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
                kept = False
                try:
                    if await self._recover(lease):
                        local.history.forget(key)  # recovery wrote to the history
                    else:
                        local.history.adopt(lease)
                    self._queue_seen(key, lease, news)
                    await self._drain(key, lease)
                    while await self._linger(key, lease):
                        await self._drain(key, lease)
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
                    local.agents.pop(key, None)
                    self._agent_of.pop(key, None)
                    self._looked.pop(key, None)  # a new lease reads its queue afresh
                    if kept:
                        local.history.release(lease)  # for the session's next lease here
                    else:
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
        started = self._started(key, lease)
        ids = {t.id for t in (handed, started) if t is not None}
        if all(turn_id in ids for turn_id in lease.queue):
            self._looked[key] = news

    def _started(self, key: SessionKey, lease: Lease) -> Turn | None:
        """The turn started under ``lease`` as it was admitted, that this worker is to run.
        (One started under another lease is for the worker that holds that lease next.)"""
        started = self._local.started.get(key)
        return started[0] if started is not None and started[1].lease is lease else None

    async def _drain(self, key: SessionKey, lease: Lease) -> None:
        local = self._local
        while True:
            dirty = key in local.dirty
            local.dirty.discard(key)
            if self._started(key, lease) is not None:
                # Started as it was admitted, under this lease: it runs first, even when the
                # process is closing (it shows running; left so, it would end owner_lost).
                first, admitted = local.started.pop(key)
                self._ran_to[key] = max(first.seq, self._ran_to.get(key, 0))
                await self._runner.run(lease, first, await self._agent(key, first), admitted)
                continue
            # A turn submitted here is most often the next one: start it without reading the
            # queue. The store refuses the start if an earlier turn (accepted by another
            # process, or parked) is still active, and then the queue says what comes first.
            turn = local.handed.pop(key, None)
            news = self.news()
            if turn is None and not dirty and news is not None and self._looked.get(key) == news:
                # Read under this lease, and nothing handed, announced or committed elsewhere
                # since: the queue holds nothing new (the read after each turn, saved).
                return
            if turn is None or turn.seq <= self._ran_to.get(key, 0):
                turn = runnable(await self._store.active_turns(key))
                if turn is None and news is not None:
                    self._looked[key] = news  # noted before the read: nothing it missed
            if turn is None or local.closing:
                return
            self._ran_to[key] = max(turn.seq, self._ran_to.get(key, 0))
            try:
                await self._runner.run(lease, turn, await self._agent(key, turn))
            except TurnNotNext:
                self._looked.pop(key, None)  # an earlier turn is active: the queue says which

    async def _agent(self, key: SessionKey, turn: Turn) -> str:
        """The name of the agent ``turn`` was sent to: its own, or the session's."""
        if turn.agent is not None:
            return turn.agent.name
        if key not in self._agent_of:
            # Read once per lease: a session's own agent does not change under it.
            record = await self._store.get_session(key)
            self._agent_of[key] = record.agent if record is not None else ""
        return self._agent_of[key]

    def _closing(self) -> bool:
        # A call, not the attribute: close() flips it while _linger awaits, and a type checker
        # that narrowed the attribute before the await would call the re-read unreachable.
        return self._local.closing

    async def _linger(self, key: SessionKey, lease: Lease) -> bool:
        """:meth:`_wait_linger`; then, if a turn is being admitted under this lease to start
        at once (:attr:`Local.claims`), wait until it has settled. True if a turn came in.

        The caller gives the lease up (``local.leases``) with no await after this returns, so
        a submit that comes later finds no lease held here and queues its turn the usual way.
        """
        local = self._local
        kept = await self._wait_linger(key, lease)
        while (claim := local.claims.get(key)) is not None:
            await claim.wait()
        return kept or self._started(key, lease) is not None

    def wake(self, key: SessionKey) -> None:
        """Wake ``key``'s worker if it lingers (an admission made under its lease settled)."""
        kicked = self._local.kicked.get(key)
        if kicked is not None:
            kicked.set()

    def _news_here(self, key: SessionKey, lease: Lease) -> bool | None:
        """What a lingering worker makes of an admission here: False when it took a newer
        lease of the session (this one is over: the worker goes on under that one), True when
        it is admitting or started a turn under this lease (:meth:`_linger` waits for it),
        None when neither."""
        local = self._local
        if key in local.granted:
            return False
        if key in local.claims or self._started(key, lease) is not None:
            return True
        return None

    def _empty_at(self, key: SessionKey) -> int | None:
        """The store's data version when the queue was last found empty under this lease
        (None: unknown, or noted some other way)."""
        looked = self._looked.get(key)
        return looked[1] if looked is not None and looked[0] == "version" else None

    async def _wait_linger(self, key: SessionKey, lease: Lease) -> bool:
        """Keep the lease a moment after the queue empties; True if a new turn came in.

        A conversation's next turn often follows within moments: holding on saves taking and
        giving up the lease (two write transactions) per turn. Turns submitted in this process
        wake the worker at once; turns accepted by another process (a load balancer spreading
        one session over several nodes) are announced by a store with a feed (PostgreSQL), or
        else seen by a look at the store every LINGER_POLL, so they do not wait for the linger
        to run out (with a :class:`ChangeCounter`, one look at its version for all lingering
        sessions, and a look at a queue only when another process wrote).
        """
        local = self._local
        if local.closing or self.linger <= 0:
            return False
        here = self._news_here(key, lease)
        if here is not None:
            return here
        if key in local.dirty:
            return True
        kicked = local.kicked[key] = asyncio.Event()
        deadline = time.monotonic() + self.linger
        # With a store that says when another process wrote (SQLite), look at the queue only
        # then: a turn accepted here kicks this directly. The first look reads it unless the
        # version is still the one noted before the queue was last found empty.
        counter = self._counter
        seen = self._empty_at(key)  # the queue was empty then: only a commit since is news
        # With a feed that announces turns queued elsewhere (PostgreSQL), no look at all while
        # it stays up: such a turn kicks this (heard_queued), and one queued before the feed
        # came up was looked for when it did (feed_changed).
        feed = self._feed
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                trusted = feed is not None and self._feed == feed
                if counter is not None and not trusted:
                    self._watch(key, seen)  # woken when the version moves past seen
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(
                        remaining if trusted or counter is not None else min(remaining, LINGER_POLL)
                    ):
                        await kicked.wait()
                kicked.clear()
                here = self._news_here(key, lease)
                if here is not None:
                    return here
                closing = self._closing()  # re-read: close() may have run while we waited
                if key in local.dirty:
                    return not closing
                if closing:
                    return False  # close() set the event to end lingering
                if feed is not None and self._feed == feed:
                    continue
                feed = None  # it went down meanwhile: look, and from now on
                if counter is not None:
                    # The watch's reading, taken before the queue is read below: a commit
                    # after it moves the version again. None: unknown, so look.
                    version = self._version
                    if version is not None and version == seen:
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
            self._polling.pop(key, None)
