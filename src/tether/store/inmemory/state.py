"""What the in-memory store holds, in plain dicts, and the one rule of its concurrency.

Every method of the store runs to completion without awaiting, so on one event loop each call
is atomic — the same guarantee a database transaction gives the other backends. The classes that
make up :class:`~tether.store.inmemory.InMemoryStore` each add the methods of one role over
this state.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from tether.errors import SessionNotFound, StaleLease
from tether.records import (
    ApiKey,
    CancelStatus,
    Decision,
    Document,
    Event,
    Item,
    Lease,
    MemoryRecord,
    MemoryWrites,
    Namespace,
    Reason,
    SessionKey,
    SessionRecord,
    Turn,
)
from tether.store import rules

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
Pair = tuple[str, str]


def words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


@dataclass
class SessionState:
    record: SessionRecord
    items: list[Item] = field(default_factory=list)
    turns: dict[str, Turn] = field(default_factory=dict)
    turn_order: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    """Ids of queued and running turns in seq order (kept so no lookup scans all turns)."""
    events: dict[str, list[Event]] = field(default_factory=dict)
    idempotency: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Idempotency key → (turn id, request digest)."""
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)
    """(turn id, call id) → decision, in the order they were asked."""
    held: dict[str, MemoryWrites] = field(default_factory=dict)
    """Memory writes of parked turns, applied (or dropped) when the turn ends."""
    next_turn_seq: int = 1
    next_item_seq: int = 1
    lease_owner: str | None = None
    lease_token: int = field(default_factory=rules.initial_token)
    lease_expires_at: float = 0.0
    idle_ttl: float | None = None
    """The TTL that counts from the latest activity (create_session's ``idle``), or None."""

    def touch(self, now: float) -> None:
        """Activity (a write of items): ``updated_at`` moves, and an idle TTL's expiry with it,
        as the SQL stores' rows do."""
        expires = now + self.idle_ttl if self.idle_ttl is not None else self.record.expires_at
        self.record = replace(self.record, updated_at=now, expires_at=expires)

    def first_active(self) -> str | None:
        return self.active[0] if self.active else None

    def parked(self) -> bool:
        """A turn waits for a decision: nothing of this session runs until it is decided."""
        return any(self.turns[t].status == "awaiting_input" for t in self.active)

    def under_way(self) -> list[str]:
        """Active turns that hold or want a worker (a parked turn holds neither)."""
        return [t for t in self.active if self.turns[t].status != "awaiting_input"]

    def last_event_seq(self, turn_id: str) -> int:
        log = self.events.get(turn_id)
        return log[-1].seq if log else 0


@dataclass(frozen=True, slots=True)
class RecordRow:
    """A memory record as the in-memory store keeps it: with its embedding and its words."""

    record: MemoryRecord
    embedding: bytes
    words: frozenset[str]


class State:
    """The dicts every role of the in-memory store reads and writes."""

    def __init__(self) -> None:
        self._sessions: dict[SessionKey, SessionState] = {}
        self._keys: dict[str, ApiKey] = {}
        self._cancels: dict[str, tuple[CancelStatus, Reason]] = {}
        # Memory and knowledge (see .recall)
        self._rows: dict[int, RecordRow] = {}
        self._seq_of: dict[str, int] = {}
        # (namespace key, collection) → {seq: None}, in seq order (a seq only ever grows).
        self._buckets: dict[tuple[str, str], dict[int, None]] = {}
        self._versions: dict[tuple[str, str], int] = {}
        self._clock = 0
        self._next_seq = 1
        self._documents: dict[str, Document] = {}

    def _get(self, key: SessionKey) -> SessionState:
        s = self._sessions.get(key)
        if s is None:
            raise SessionNotFound("session not found")
        return s

    def _fenced(self, lease: Lease) -> SessionState:
        s = self._get(lease.key)
        if s.lease_token != lease.token:
            raise StaleLease(rules.stale_message(lease.token, s.lease_token))
        return s

    # -- internals ---------------------------------------------------------------------------
    def _bump(self, pairs: Iterable[Pair]) -> None:
        # One clock for every pair: a version is never handed out twice, even for a pair that
        # forget removed and a later write brought back.
        self._clock += 1
        for pair in pairs:
            self._versions[pair] = self._clock

    def _store(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        stored = replace(record, meta=copy.deepcopy(record.meta), seq=self._next_seq)
        self._next_seq += 1
        self._rows[stored.seq] = RecordRow(stored, bytes(embedding), words(stored.content))
        self._seq_of[stored.id] = stored.seq
        self._buckets.setdefault((stored.namespace.key, stored.collection), {})[stored.seq] = None
        return stored

    def _drop(self, seqs: Iterable[int]) -> set[Pair]:
        changed: set[Pair] = set()
        for seq in list(seqs):
            row = self._rows.pop(seq)
            del self._seq_of[row.record.id]
            pair = (row.record.namespace.key, row.record.collection)
            bucket = self._buckets[pair]
            del bucket[seq]
            if not bucket:
                del self._buckets[pair]
            changed.add(pair)
        return changed

    def _drop_session_memory(self, key: SessionKey) -> None:
        """Delete everything of the session's own scope: records, documents, versions."""
        ns = Namespace.session(key)
        self._drop([seq for seq, row in self._rows.items() if row.record.namespace == ns])
        for doc in [d for d in self._documents.values() if d.namespace == ns]:
            del self._documents[doc.id]
        for pair in [p for p in self._versions if p[0] == ns.key]:
            del self._versions[pair]

    def _drop_conversation_memory(self, key: SessionKey) -> None:
        """Delete the session-scope memory its turns wrote (the history it came from is cleared)."""
        ns = Namespace.session(key)
        seqs = [
            seq
            for seq, row in self._rows.items()
            if row.record.namespace == ns
            and not row.record.collection
            and row.record.meta.get("author") in rules.CONVERSATION_AUTHORS
        ]
        self._bump(self._drop(seqs))

    def _apply_memory(self, writes: MemoryWrites) -> None:
        for ns, record_id in writes.delete:
            seq = self._seq_of.get(record_id)
            if seq is not None and self._rows[seq].record.namespace == ns:
                self._bump(self._drop([seq]))
        if writes.put:
            stored = [self._store(record, embedding) for record, embedding in writes.put]
            self._bump({(r.namespace.key, r.collection) for r in stored})
