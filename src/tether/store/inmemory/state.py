"""What the in-memory store holds, in plain dicts, and the one rule of its concurrency.

Every method of the store runs to completion without awaiting, so on one event loop each call
is atomic — the same guarantee a database transaction gives the other backends. The classes that
make up :class:`~tether.store.inmemory.InMemoryStore` each add the methods of one role over
this state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tether.errors import SessionNotFound, StaleLease
from tether.records import (
    ApiKey,
    CancelStatus,
    Document,
    Event,
    Item,
    Lease,
    MemoryRecord,
    Reason,
    SessionKey,
    SessionRecord,
    Turn,
)
from tether.store import rules


@dataclass
class SessionState:
    record: SessionRecord
    items: list[Item] = field(default_factory=list)
    turns: dict[str, Turn] = field(default_factory=dict)
    turn_order: list[str] = field(default_factory=list)
    active: list[str] = field(default_factory=list)
    """Ids of queued and running turns in seq order (kept so no lookup scans all turns)."""
    events: dict[str, list[Event]] = field(default_factory=dict)
    next_turn_seq: int = 1
    next_item_seq: int = 1
    lease_owner: str | None = None
    lease_token: int = field(default_factory=rules.initial_token)
    lease_expires_at: float = 0.0

    def first_active(self) -> str | None:
        return self.active[0] if self.active else None

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
