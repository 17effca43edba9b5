"""A worker's lease kept a moment after its session's queue empties, and what ends the wait.

A conversation's next turn often follows within moments: holding on to the lease saves taking
and giving it up (two write transactions) per turn, with a store that cannot fold them into
the turns' own writes. One that can (every store here: the admission takes a free lease,
:class:`~tether.store.capabilities.StartingQueue`, and the ending gives it up,
:class:`~tether.store.capabilities.ReleasingEnd`) saves nothing by lingering, and does not by
default (:data:`~tether.scheduler.core.LINGER`). A turn submitted in this process wakes the
lingering worker at once (its kick). One accepted by another process (a load balancer spreading
a session over several nodes) must wake it too, without a look at the store every few
milliseconds while nothing happens:

* a store with a feed (PostgreSQL's ``LISTEN/NOTIFY``) announces it, so nothing is read while
  the feed stays up (:meth:`Lingering.feed_changed`);
* a store that counts commits (SQLite's data version, :class:`ChangeCounter`) is watched by one
  task for every lingering session, looking only when another process rang (its doorbell), and
  a session's queue is read only when the version moved past the one it was last found empty
  under;
* any other store is looked at every LINGER_POLL.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from tether.errors import SessionNotFound
from tether.records import Lease, SessionKey, Turn
from tether.scheduler.local import Local
from tether.scheduler.news import StoreNews
from tether.store.capabilities import ChangeCounter
from tether.store.protocol import TurnReader

LINGER_POLL = 0.05
"""Seconds between looks at the store for turns accepted elsewhere while a lease lingers (with
a store other processes ring: a look only when rung, no more often than this)."""


def runnable(active: list[Turn]) -> Turn | None:
    """The turn to run next: the session's first active turn, if it is queued (new, or decided
    and going on). Behind a turn parked on a decision nothing runs: order is the session's."""
    if active and active[0].status == "queued":
        return active[0]
    return None


class Lingering:
    """The lingering of this process's session workers (see the module's doc)."""

    def __init__(self, store: TurnReader, local: Local, *, seconds: float) -> None:
        self._store = store
        self._local = local
        self.seconds = seconds
        """How long a lease is kept once its queue is empty (0: given up at once)."""
        self._counter = store if isinstance(store, ChangeCounter) else None
        """The store as a :class:`ChangeCounter` (SQLite), looked up once, or None."""
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

    def feed_changed(self, up: bool) -> None:
        """The store's feed came up (or went down: lingering workers that trusted it look for
        themselves now). The caller has every session held here look at its queue once when
        it comes up: a turn queued elsewhere while it was down was announced to nobody."""
        if not up:
            self._feed = None
            for kicked in list(self._local.kicked.values()):
                kicked.set()
            return
        self._feeds += 1
        self._feed = self._feeds

    async def stop(self) -> None:
        """Stop the version watch (the scheduler closes; no session lingers any more)."""
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    def here(self, key: SessionKey, lease: Lease) -> bool | None:
        """What a lingering worker makes of an admission here: False when it took a newer
        lease of the session (this one is over: the worker goes on under that one), True when
        it is admitting or started a turn under this lease (the worker waits for it), None
        when neither."""
        local = self._local
        if key in local.granted:
            return False
        if key in local.claims or local.started_under(key, lease) is not None:
            return True
        return None

    async def wait(self, key: SessionKey, lease: Lease, seen: int | None) -> bool:
        """Keep ``lease`` a moment after the queue empties; True if a new turn came in.
        ``seen``: the store's data version when the queue was last found empty under this
        lease (None: unknown, or noted some other way), so only a commit since is news."""
        local = self._local
        if local.closing or self.seconds <= 0:
            return False
        here = self.here(key, lease)
        if here is not None:
            return here
        if key in local.dirty:
            return True
        kicked = local.kicked[key] = asyncio.Event()
        deadline = time.monotonic() + self.seconds
        # With a store that says when another process wrote (SQLite), look at the queue only
        # then: a turn accepted here kicks this directly. The first look reads it unless the
        # version is still the one noted before the queue was last found empty.
        counter = self._counter
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
                here = self.here(key, lease)
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

    def _closing(self) -> bool:
        # A call, not the attribute: close() flips it while wait() awaits, and a type checker
        # that narrowed the attribute before the await would call the re-read unreachable.
        return self._local.closing

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
