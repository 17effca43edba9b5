"""A session's history as the holder of its lease knows it: a window without a read per turn.

While a worker holds a session's lease, every item written to the session goes through it
(fenced writes), except clearing the history and ending a waiting turn, which need no lease
and leave a gap in the item seqs (:data:`tether.store.rules.ITEM_SEQ_GAP`). So the worker
knows the history: what it read once, plus what it wrote since, as long as each of its writes
starts at the seq it expected. A write that does not (someone moved the history meanwhile)
starts the cache over from that write. The items of an ending's own write are not returned by
the store; they get the seqs the store gives (:func:`~tether.store.rules.stored_items`), which
the next write confirms or refutes, and their ``created_at`` is this process's clock at the
write (nothing that reads a window looks at it).

Kept per lease, and past it: when the lease is given up, what it knew is put aside
(:meth:`HistoryCache.release`), and the session's next lease here takes it up again
(:meth:`HistoryCache.adopt`) if nobody has touched the history in between — its token is one
past the old one (no other lease was granted: a session deleted and made again starts its
tokens at the clock) and the store gives the seq the old holder expected next (a change
without a lease leaves a gap). A conversation whose turns come further apart than a linger
then costs no history read a turn. A lost lease starts afresh. Never the truth, only what the
store said and what this process wrote.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tether.loop.window import ItemMemo
from tether.records import Item, Lease, NewItem, SessionKey, TurnStatus
from tether.store import rules
from tether.store.protocol import HistoryStore

MAX_ITEMS = 4096
"""Items kept per session at most (the newest): a window needs the newest ones only."""
MAX_PUT_ASIDE = 20_000
"""Items kept at most, in all, for sessions whose lease was given up (the least recently
given up are dropped first): what an idle session costs in memory is bounded."""


@dataclass(slots=True)
class Known:
    """What one lease's holder knows: every item not excluded with ``floor <= seq < next_seq``
    (ascending), and whether nothing older exists."""

    token: int
    floor: int
    next_seq: int
    items: list[Item] = field(default_factory=list)
    from_start: bool = False
    summary: Item | None = None
    summary_known: bool = False


class HistoryCache:
    def __init__(self) -> None:
        self._known: dict[SessionKey, Known] = {}
        self._memos: dict[SessionKey, tuple[int, ItemMemo]] = {}
        self._aside: OrderedDict[SessionKey, tuple[Known, ItemMemo | None]] = OrderedDict()
        """What given-up leases knew, oldest first, for the sessions' next leases here."""
        self._aside_items = 0

    def __len__(self) -> int:
        return len(self._known)

    def of(self, lease: Lease) -> Known | None:
        known = self._known.get(lease.key)
        return known if known is not None and known.token == lease.token else None

    def memo(self, lease: Lease) -> ItemMemo:
        """What the lease's turns learnt of their items' sizes and renderings (one per lease:
        a new lease starts afresh, like what is known of the history)."""
        held = self._memos.get(lease.key)
        if held is None or held[0] != lease.token:
            held = self._memos[lease.key] = (lease.token, ItemMemo())
        return held[1]

    def forget(self, key: SessionKey) -> None:
        self._known.pop(key, None)
        self._memos.pop(key, None)
        self._put_back(key)

    def release(self, lease: Lease) -> None:
        """``lease`` is given up: keep what it knew aside for the session's next lease."""
        key = lease.key
        known = self._known.pop(key, None)
        memo = self._memos.pop(key, None)
        self._put_back(key)
        if known is None or known.token != lease.token:
            return
        self._aside[key] = (known, memo[1] if memo is not None and memo[0] == lease.token else None)
        self._aside_items += len(known.items)
        while self._aside_items > MAX_PUT_ASIDE and self._aside:
            _, (dropped, _) = self._aside.popitem(last=False)
            self._aside_items -= len(dropped.items)

    def adopt(self, lease: Lease) -> bool:
        """A new ``lease``, under which nothing was recovered: take up what the previous one
        here knew, if the history is as it left it (True); otherwise start afresh."""
        entry = self._put_back(lease.key)
        if entry is None:
            return False
        known, memo = entry
        if (
            lease.history_seq is None
            or lease.token != known.token + 1
            or lease.history_seq != known.next_seq
        ):
            return False  # another lease came between, or the history moved without one
        known.token = lease.token
        self._known[lease.key] = known
        if memo is not None:
            self._memos[lease.key] = (lease.token, memo)
        return True

    def _put_back(self, key: SessionKey) -> tuple[Known, ItemMemo | None] | None:
        entry = self._aside.pop(key, None)
        if entry is not None:
            self._aside_items -= len(entry[0].items)
        return entry

    def wrote(self, lease: Lease, written: Sequence[Item]) -> None:
        """Items a fenced write stored, in seq order (consecutive within the write)."""
        if not written:
            return
        known = self.of(lease)
        first = written[0].seq
        if known is None or known.next_seq != first:
            known = Known(lease.token, floor=first, next_seq=first)
            self._known[lease.key] = known
        for item in written:
            if not item.excluded:
                known.items.append(item)
                if item.kind == "summary":
                    known.summary, known.summary_known = item, True
        known.next_seq = written[-1].seq + 1
        if len(known.items) > MAX_ITEMS:
            del known.items[: len(known.items) - MAX_ITEMS]
            known.floor, known.from_start = known.items[0].seq, False

    def ended(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], status: TurnStatus
    ) -> None:
        """A turn's ending was written with ``items``: they take the next seqs, and an ending
        that deletes or excludes the turn's items takes them out."""
        known = self.of(lease)
        if known is None:
            return
        if items:
            self.wrote(lease, rules.stored_items(turn_id, known.next_seq, items, time.time()))
        if rules.items_effect(status) != "keep":
            known.items = [i for i in known.items if i.turn_id != turn_id]
            if known.summary is not None and known.summary.turn_id == turn_id:
                known.summary, known.summary_known = None, False


class CachedHistory:
    """The turn loop's :class:`~tether.loop.context.HistoryReader` over a lease's cache, with
    the store behind it for what the cache does not hold."""

    def __init__(self, store: HistoryStore, cache: HistoryCache, lease: Lease) -> None:
        self._store = store
        self._cache = cache
        self._lease = lease

    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        """The newest ``limit`` items older than ``before_seq``, newest first (as the store)."""
        key = self._lease.key
        known = self._cache.of(self._lease)
        if known is None or limit <= 0:
            return await self._store.recent_items(key, before_seq=before_seq, limit=limit)
        before = known.next_seq if before_seq is None else before_seq
        if not known.floor <= before <= known.next_seq:
            return await self._store.recent_items(key, before_seq=before_seq, limit=limit)
        cut = bisect.bisect_left(known.items, before, key=lambda i: i.seq)
        if cut >= limit or known.from_start:
            return known.items[max(cut - limit, 0) : cut][::-1]
        # Older than what is known: read them, and keep them (the store's page holds every
        # item from its oldest up to the floor, so what is known stays whole).
        chosen, floor = known.items[:cut], known.floor
        older = await self._store.recent_items(key, before_seq=floor, limit=limit - cut)
        if self._cache.of(self._lease) is known and known.floor == floor:
            known.items[:0] = older[::-1]
            if older:
                known.floor = older[-1].seq
            if len(older) < limit - cut:
                known.from_start = True
        return (older[::-1] + chosen)[-limit:][::-1]

    async def latest_summary(self) -> Item | None:
        known = self._cache.of(self._lease)
        if known is not None and known.summary_known:
            return known.summary
        summary = await self._store.latest_summary(self._lease.key)
        known = self._cache.of(self._lease)
        if known is not None and (summary is None or summary.seq < known.next_seq):
            known.summary, known.summary_known = summary, True
        return summary
