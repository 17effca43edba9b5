"""The store seam, cut by role: each caller types against the part it uses.

:class:`Store` is the union every backend implements (in-memory, SQLite, PostgreSQL); the
scheduler sees turns, leases and fenced writes, the turn's history reader sees
:class:`HistoryStore`, the memory service :class:`RecallStore`, authentication
:class:`KeyStore`. Two rules every implementation keeps, and the conformance suite checks:

* **Scoped by key.** Every read and write names a :class:`SessionKey` (tenant, owner, id) or a
  memory :class:`Namespace`; a session of another owner is simply not there.
* **Fenced writes.** A turn's writes carry the :class:`Lease` they were made under. The
  implementation checks, *in the same transaction as the write*, that the lease's token is still
  the session's current one, and raises :class:`StaleLease` otherwise, so a process that lost its
  lease (paused, partitioned, presumed dead) can never add to a history someone else now owns.

What a write must *do* (admitting a turn, the effects of each ending, recovering a dead owner's
turn) is decided once, in :mod:`tether.store.rules`; a backend only carries it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tether.records import (
    AgentRef,
    ApiKey,
    CancelStatus,
    Decision,
    DecisionStatus,
    Document,
    Event,
    ForgetReport,
    Idempotency,
    Item,
    Lease,
    MemoryRecord,
    MemoryWrites,
    Namespace,
    NewEvent,
    NewItem,
    Policy,
    PrincipalLimits,
    Reason,
    SessionKey,
    SessionOrder,
    SessionRecord,
    SessionStats,
    Turn,
    TurnEnding,
    Usage,
    VectorSnapshot,
    Verdict,
)
from tether.store.rules import DEFAULT_MAX_QUEUE


class Lifecycle(Protocol):
    async def open(self) -> None:
        """Connect and apply pending migrations."""
        ...

    async def close(self) -> None: ...

    async def ping(self) -> None:
        """Raise :class:`StoreError` when the store cannot answer."""
        ...


class SessionReader(Protocol):
    async def get_session(self, key: SessionKey) -> SessionRecord | None: ...


class SessionStore(SessionReader, Protocol):
    async def create_session(
        self,
        key: SessionKey,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        exist_ok: bool = False,
        max_sessions: int | None = None,
        idle: bool = False,
    ) -> tuple[SessionRecord, bool]:
        """Create the session; returns ``(record, created)``.

        ``ttl_seconds`` counts from the creation, or with ``idle`` from the session's latest
        activity (its expiry moves with every write that moves ``updated_at``: a turn's
        items, its state) until an update gives it a TTL of its own.

        With ``exist_ok`` an existing session is returned unchanged; otherwise it is a Conflict.
        A new session when the owner already has ``max_sessions`` is LimitExceeded
        (:func:`tether.store.rules.admit_session`, checked in the same transaction).
        """
        ...

    async def list_sessions(
        self,
        tenant: str,
        owner: str,
        *,
        limit: int = 50,
        after: str | None = None,
        order: SessionOrder = "id",
        contains: str | None = None,
    ) -> list[SessionRecord]:
        """The owner's sessions (``contains``: those whose id contains that text), ordered by
        ``session_id``, or with ``order="newest"`` by ``updated_at`` descending then id. A page
        goes on after ``after``: the last id of the previous page, or with ``newest`` its
        :func:`~tether.store.rules.newest_cursor`."""
        ...

    async def update_session(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        """Replace the given fields; raises SessionNotFound, or Conflict on a moved revision."""
        ...

    async def delete_session(self, key: SessionKey) -> bool:
        """Delete the session with its items, turns and events."""
        ...

    async def session_stats(self, key: SessionKey) -> SessionStats:
        """Counts of items, turns and queued-or-running turns; SessionNotFound when absent."""
        ...

    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        """History in ``seq`` order, excluded items included (they are flagged)."""
        ...

    async def clear_items(self, key: SessionKey) -> int:
        """Delete the session's history: items (summaries included), its ended turns with their
        events, and the session-scope memory its turns wrote; SessionBusy while a turn is
        active. Turn seqs go on from where they were. Returns the items deleted."""
        ...


class HistoryStore(Protocol):
    """What a running turn reads of its session's history."""

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        """The newest items that may reach a model, newest first, for paging backwards.

        Excluded items (of failed or rolled back turns) are left out. Cost is proportional to
        ``limit``, not to the length of the history.
        """
        ...

    async def latest_summary(self, key: SessionKey) -> Item | None:
        """The newest ``summary`` item whose turn did not fail or roll back, if any."""
        ...

    async def latest_handoff(self, key: SessionKey) -> Item | None:
        """The newest ``handoff`` item whose turn did not fail or roll back, if any: it names the
        agent the session's conversation was last passed to."""
        ...


class TurnReader(Protocol):
    """Reading turns and their events: what waiting and following a turn need."""

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None: ...

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]: ...

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        """Turns not ended (queued, running, awaiting_input) in ``seq`` order."""
        ...

    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]: ...


class TurnLog(TurnReader, Protocol):
    """Admitting, cancelling and signalling turns (none of it needs the lease)."""

    async def enqueue_turn(
        self,
        key: SessionKey,
        *,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int = DEFAULT_MAX_QUEUE,
        agent: AgentRef | None = None,
        limits: PrincipalLimits | None = None,
        idempotency: Idempotency | None = None,
        by: str | None = None,
    ) -> Turn:
        """Queue a turn at the next ``seq`` and write its ``turn.queued`` event, atomically.

        The policy is applied by :func:`tether.store.rules.admit` in the same transaction:
        ``reject``: SessionBusy if any turn is queued or running; ``enqueue``: QueueFull when
        ``max_queue`` turns are already queued; SessionNotFound for an unknown session and for
        one past its ``expires_at``. ``agent`` is stored with the turn: the template it
        must run (None: the session's agent). ``limits`` are the owner's bounds, applied by
        :func:`tether.store.rules.admit_for_principal` in the same transaction. With
        ``idempotency``, a turn the key already made on this session is returned instead
        (before any admission check: it is the answer to this very request), unless
        :func:`tether.store.rules.replays` says the request differs (IdempotencyKeyReused) or
        the key is older than a day (it then names the new turn).

        ``by`` is the lease owner of the submitting process. A store that announces changes
        (:class:`~tether.store.capabilities.CancelFeed`) tells the process holding the
        session's lease of the new turn, unless that is ``by`` (which wakes its own worker);
        the others ignore it.
        """
        ...

    async def end_waiting_turn(
        self,
        key: SessionKey,
        turn_id: str,
        reason: Reason,
        *,
        status: CancelStatus = "cancelled",
    ) -> Turn | None:
        """End a turn nobody is running as ``status`` (cancelled, interrupted, rolled back);
        None when it is running or ended.

        Such a turn is queued (never started, or decided and waiting to go on) or
        ``awaiting_input``. Its pending decisions expire (``decided_by`` = the reason, each
        with ``decision.made``), its unanswered tool calls get an aborted result, the ending's
        effect on items applies (:func:`tether.store.rules.items_effect`), the memory it holds
        is applied when :func:`tether.store.rules.keeps_memory` says so, and ``turn.ended`` is
        written. No lease: while a turn waits, nothing else writes it, and every write that
        moves it is conditional on its status.
        """
        ...

    async def request_cancel(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> bool:
        """Ask whichever process runs ``turn_id`` to end it as ``status`` with ``reason``.

        Only a running turn can be asked, and the first request wins: returns False when the
        turn is not running or already has a request. The owner reads requests with
        :meth:`cancel_requests` and ends the turn itself (its writes stay fenced).
        """
        ...

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        """``turn_id → (status, reason)`` for the given turns that have a request pending."""
        ...


class LeaseStore(Protocol):
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        """Take the session's lease if it is free or expired, with a new (incremented) token.

        Returns None while another owner holds an unexpired lease. A store that can tell, in
        the same transaction, whether a turn was left running says so in ``left_running``.
        """
        ...

    async def lease_holder(self, key: SessionKey) -> str | None:
        """The owner of the session's unexpired lease, or None."""
        ...

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        """Take the lease from ``from_owner`` (known to be dead) even though it has not expired.

        Conditional on ``from_owner`` still holding it, so two takers cannot both win.
        """
        ...

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        """Extend each lease still current; returns the renewed ones (the others are lost)."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up if it is still current (no-op otherwise)."""
        ...


class FencedWrites(Protocol):
    """A turn's writes, each checked against its lease in the transaction that makes it."""

    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        """Move a queued turn to running and write its first items and events.

        Raises :class:`~tether.errors.TurnNotNext` when an earlier turn of the session is
        still active (queued, running or parked): the store keeps the session's order, so a
        caller may start a turn it was handed without reading the queue first. A turn that is
        not a new queued one is refused for its status first (:class:`Conflict`).
        """
        ...

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]: ...

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> Turn:
        """Write the last items and events and the terminal status in one transaction.

        ``memory`` (the turn's notes and what the model remembered) is applied in that same
        transaction when :func:`tether.store.rules.keeps_memory` says the ending keeps the
        turn's items, and dropped otherwise.

        What the ending does to the turn's items is :func:`tether.store.rules.items_effect`
        (``failed`` excludes them, ``rolled_back`` deletes them).
        """
        ...

    async def park_turn(
        self,
        lease: Lease,
        turn_id: str,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        decision: Decision,
        *,
        usage: Usage,
        memory: MemoryWrites | None = None,
    ) -> Turn:
        """Move a running turn to ``awaiting_input`` with the decision it waits for.

        In one fenced transaction: the items (the step's tool calls and the results of the calls
        before the one asked about), the events (``decision.requested`` among them), the
        decision row (pending; ``(turn_id, call_id)`` is new), the usage so far and the memory
        writes the turn holds (kept with it until it ends). The caller then gives up the lease.
        """
        ...

    async def resume_turn(
        self, lease: Lease, turn_id: str, events: Sequence[NewEvent]
    ) -> tuple[list[Item], MemoryWrites | None]:
        """Move a decided turn (queued, and started before) back to running, under the lease.

        Returns the turn's items so far, in seq order, and the memory writes it held.
        """
        ...

    async def set_state(self, lease: Lease, name: str, value: Any) -> None:
        """Set the key ``name`` of the session's state to ``value`` (None removes it), keeping
        its other keys (:func:`tether.store.rules.with_state`), in one transaction fenced by
        the lease: what a running turn keeps for the rest of the session (its active skills).
        """
        ...

    async def recover(self, lease: Lease) -> list[Turn]:
        """Under a freshly acquired lease: end turns left ``running`` as failed/``owner_lost``.

        Unanswered tool calls get an aborted result, and each such turn gets its terminal event
        (:func:`tether.store.rules.owner_lost`, :func:`tether.store.rules.aborted_results`).
        """
        ...


class DecisionStore(Protocol):
    """Decisions a parked turn waits for (DESIGN §7): read, decided and expired from any
    process, without the session's lease."""

    async def list_decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
        limit: int = 100,
    ) -> list[Decision]:
        """The session's decisions, oldest first (SessionNotFound for an unknown session)."""
        ...

    async def decide(
        self,
        key: SessionKey,
        turn_id: str,
        call_id: str,
        verdict: Verdict,
        *,
        answer: str | None = None,
        by: str,
    ) -> Decision:
        """Record a human's decision, in one transaction: :func:`tether.store.rules.settle`
        says what it becomes (DecisionMade with the first decision when it is not pending,
        InvalidInput for a verdict its kind does not take); ``decision.made`` is written on the
        turn; the turn goes from ``awaiting_input`` to ``queued`` so the session's next owner
        goes on with it; ``always`` adds the tool to the session state
        (:func:`tether.store.rules.with_always`). DecisionNotFound when the session has no such
        decision (unknown or another owner's: the same)."""
        ...

    async def expire_decisions(self, now: float, limit: int = 100) -> list[SessionKey]:
        """End up to ``limit`` pending decisions whose deadline has passed as ``expired``, as
        :meth:`decide` would (event, turn queued again); returns their sessions. Safe on every
        node at once: each decision ends once."""
        ...

    async def next_decision_deadline(self) -> float | None:
        """The earliest deadline of a pending decision, if any (when to sweep next)."""
        ...


class Maintenance(Protocol):
    async def sweep_expired(self, now: float, limit: int = 500) -> list[SessionKey]:
        """Delete up to ``limit`` sessions past ``expires_at`` that are idle; returns their keys
        (so what lives outside the store, a workspace, goes with them).

        Idle means no queued or running turn and no unexpired lease, so a sweep never pulls a
        session from under a turn. Safe to run on every node at once: each delete is atomic.
        """
        ...

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        """Sessions with a queued or running turn and none parked on a decision (for recovery
        after a restart; a parked turn's session has nothing to run until it is decided).

        With ``unowned_at``, only those whose lease is free or expired at that time: work
        nobody is doing (its process died, or a store outage made it give up).
        """
        ...


class KeyStore(Protocol):
    async def create_api_key(self, key: ApiKey) -> None: ...

    async def api_key_by_hash(self, digest: str) -> ApiKey | None: ...

    async def list_api_keys(self) -> list[ApiKey]: ...

    async def revoke_api_key(self, key_id: str) -> bool:
        """Mark the key revoked; False when there is no such active key."""
        ...

    async def count_api_keys(self) -> int:
        """Active (unrevoked) keys."""
        ...


class RecallStore(Protocol):
    """Memory records and knowledge documents (DESIGN §8).

    Records (memory items and knowledge chunks) live in namespaces (:class:`Namespace`); every
    call names the namespaces it may touch, built by the caller from the principal, and the store
    never returns or changes a record outside them. Search is split: the store does the lexical
    half (SQLite FTS5, PostgreSQL ``tsvector``) and hands out embeddings per namespace with a
    version, so the vector half runs in memory (numpy) over a matrix cached until the version
    moves.
    """

    # -- records ---------------------------------------------------------------------------------
    async def put_memory(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        """Insert a new record (its ``id`` must be new); returns it with ``seq`` assigned."""
        ...

    async def update_memory(
        self,
        ns: Namespace,
        record_id: str,
        *,
        content: str,
        kind: str,
        embedding: bytes,
        expected_revision: int,
        now: float,
    ) -> MemoryRecord:
        """Compare-and-set: replace content, kind and embedding when the revision is still
        ``expected_revision``; the revision then grows by one.

        Raises :class:`MemoryNotFound` when there is no such record in ``ns`` and
        :class:`RevisionConflict` (with the current revision) when it moved.
        """
        ...

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None: ...

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        """The record with this id in any of ``namespaces`` (callers rarely know its scope)."""
        ...

    async def locate_memory(self, record_id: str) -> Namespace | None:
        """The namespace a record lives in (nothing of its content): callers check the principal
        may read that namespace before they fetch the record from it."""
        ...

    async def list_memory(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str = "",
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        """Records of ``collection`` (``""``: memory items) in ``namespaces``, oldest first."""
        ...

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        """The records with these ``seq`` that lie in ``namespaces`` (others are left out)."""
        ...

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool: ...

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        """Delete ``ns``'s records of ``collection``; ``None``: every record and document."""
        ...

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        """``seq`` of the best lexical matches of any of ``terms`` (words: letters and digits
        only), best first."""
        ...

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        """A number that changes whenever a record of ``ns``/``collection`` is added, changed or
        deleted (cheap: it is read before every vector search)."""
        ...

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        """:meth:`vector_version` of each namespace, in order, in one round trip (a turn reads
        those of every scope it recalls from)."""
        ...

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot: ...

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        """Store a document and its chunks in one transaction."""
        ...

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]: ...

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        """Delete a document and its chunks."""
        ...

    # -- quotas ----------------------------------------------------------------------------------
    async def storage_used(self, tenant: str, user: str) -> int:
        """Bytes of records one user keeps: memory items and knowledge chunks (text as UTF-8,
        and embedding) in their session and user namespaces, and those they wrote into their
        tenant's shared ones (agent, tenant: ``author`` is the user). What a per-user storage
        quota is checked against; indexes and document rows are not counted."""
        ...

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        """Delete everything of one user: sessions (items, turns, events, summaries), session
        and user memory, user-scope knowledge and its documents. Shared (agent, tenant) records
        stay. One transaction."""
        ...


class RecallBackend(SessionReader, RecallStore, Protocol):
    """What the memory service uses: records, and whether a session exists."""


class Store(
    Lifecycle,
    SessionStore,
    HistoryStore,
    TurnLog,
    LeaseStore,
    FencedWrites,
    DecisionStore,
    Maintenance,
    KeyStore,
    RecallStore,
    Protocol,
):
    """Everything durable: the union of the roles, what every backend implements."""
