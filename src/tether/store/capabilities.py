"""What a store may offer beyond :class:`~tether.store.protocol.Store`, each on its own: the
scheduler looks for them once (``isinstance`` against these runtime-checkable protocols) and
does without where a store has none.

* :class:`ChangeCounter`: it says cheaply when another process wrote, and rings when one did
  (SQLite's data version and doorbell);
* :class:`LeasingQueue`: it admits a turn and takes the idle session's lease in one write;
* :class:`StartingQueue`: it admits a turn under the lease its submitter holds and starts it in
  the same write when nothing is ahead of it;
* :class:`ReleasingEnd`: it ends a turn and gives the session's lease up in the same write
  when nothing else of the session is active;
* :class:`CancelFeed`: it announces cancel requests and queued turns as they are made
  (PostgreSQL's LISTEN/NOTIFY);
* :class:`OwnThread`: it runs its calls on a thread of its own (SQLite), which the server
  pins to its event loop's CPU (:mod:`tether.affinity`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from tether.records import (
    AgentRef,
    Idempotency,
    Item,
    Lease,
    MemoryWrites,
    NewEvent,
    NewItem,
    Policy,
    PrincipalLimits,
    SessionKey,
    Turn,
    TurnEnding,
)
from tether.store.rules import DEFAULT_MAX_QUEUE


@runtime_checkable
class ChangeCounter(Protocol):
    """A store that can say cheaply whether another process wrote to it.

    Optional, for stores shared by processes that cannot announce changes (SQLite): a poller
    reads what it polls for only when the counter moved, so a process whose turns wait on their
    models reads nothing meanwhile. The counter moves for writes by *other* processes; a
    process's own writes come to its pollers as in-process signals.
    """

    async def data_version(self) -> int:
        """A number that changes when another process has committed since the last call."""
        ...

    def seen_version(self) -> int:
        """What :meth:`data_version` said when the store last looked (it looks before each
        batch of calls it runs), without I/O: noted before a read and unchanged later, no other
        process had committed by the time the store last looked."""
        ...

    def heard(self) -> int | None:
        """How many times other processes have announced a commit to this store (no I/O);
        None when nothing announces them, and pollers look at :meth:`data_version` often.

        Noted before a look at :meth:`data_version`, it makes :meth:`hear` return for any
        commit the look may have missed: the announcement comes after the commit."""
        ...

    async def hear(self, after: int) -> None:
        """Return once more than ``after`` announcements were heard (at once when nothing
        announces them any more); bound it with ``asyncio.timeout``."""
        ...


@runtime_checkable
class LeasingQueue(Protocol):
    """A store that can queue a turn and take the session's lease for the submitter in one
    transaction (optional): a turn on an idle session then costs one write where it cost two,
    the admission and the worker's :meth:`LeaseStore.acquire_lease`."""

    async def enqueue_turn_leased(
        self,
        key: SessionKey,
        *,
        owner: str,
        ttl: float,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int = DEFAULT_MAX_QUEUE,
        agent: AgentRef | None = None,
        limits: PrincipalLimits | None = None,
        idempotency: Idempotency | None = None,
    ) -> tuple[Turn, Lease | None]:
        """:meth:`TurnLog.enqueue_turn`; and when it queued a new turn (not a retry's) and
        the session's lease is free or expired, the lease, taken for ``owner`` in the same
        transaction as :meth:`LeaseStore.acquire_lease` takes it (its ``active`` turns, the new
        one among them, and its ``history_seq`` told). None when the lease is held."""
        ...


@runtime_checkable
class StartingQueue(Protocol):
    """A store that can admit a turn under a lease its caller holds and start it at once
    (optional): a conversation's next turn, sent while its session's lease lingers in this
    process, is then accepted and started in one write where it took two, the admission and the
    worker's :meth:`~tether.store.protocol.FencedWrites.start_turn`."""

    async def enqueue_turn_started(
        self,
        lease: Lease,
        *,
        turn_id: str,
        input: str,
        policy: Policy,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        max_queue: int = DEFAULT_MAX_QUEUE,
        agent: AgentRef | None = None,
        limits: PrincipalLimits | None = None,
        idempotency: Idempotency | None = None,
    ) -> tuple[Turn, list[Item] | None]:
        """:meth:`~tether.store.protocol.TurnLog.enqueue_turn` on ``lease``'s session, fenced
        like every write under the lease (StaleLease once it is lost; nothing written then).
        When the turn is new (not a retry's) and no other turn of the session is active, it
        is started in the same transaction as :meth:`start_turn` starts it, with ``items`` and
        ``events`` (``turn.started``, seq 2): the running turn and its items are returned.
        Otherwise the turn as admitted, and None."""
        ...

    async def enqueue_turn_taken(
        self,
        key: SessionKey,
        *,
        owner: str,
        ttl: float,
        turn_id: str,
        input: str,
        policy: Policy,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        max_queue: int = DEFAULT_MAX_QUEUE,
        agent: AgentRef | None = None,
        limits: PrincipalLimits | None = None,
        idempotency: Idempotency | None = None,
        expect_agent: str | None = None,
    ) -> tuple[Turn, Lease | None, list[Item] | None]:
        """:meth:`LeasingQueue.enqueue_turn_leased`; and when it took the lease and the new
        turn is the session's only active one, the turn started under that lease in the same
        transaction, as :meth:`enqueue_turn_started` starts it (the lease's ``history_seq`` is
        the history before the turn's items). The turn, the lease (None when it was held),
        and the started turn's items (None when it was not started).

        ``expect_agent``: the session's own agent as the caller knows it (the turn's agent was
        chosen by it); AgentChanged, with nothing written, when the session names another.

        A turn on an idle session (the first of a conversation's lease) is then accepted,
        leased and started in one write where it took two (and three with a read of the
        session for its agent)."""
        ...


@runtime_checkable
class ReleasingEnd(Protocol):
    """A store that can end a turn and give its session's lease up in one transaction
    (optional): a turn on a session whose worker has nothing else to run then costs two writes,
    its admission (:meth:`StartingQueue.enqueue_turn_taken`) and its end, where it cost three
    (and a lease kept a moment in case another turn came, a watch of the store meanwhile)."""

    async def end_turn_released(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> tuple[Turn, bool]:
        """:meth:`~tether.store.protocol.FencedWrites.end_turn`; and in the same transaction,
        when no other turn of the session is active (queued, running or awaiting input), the
        lease given up as :meth:`~tether.store.protocol.LeaseStore.release_lease` gives it up.
        The ended turn, and whether the lease was given up (False: a turn is left to run, and
        the lease is still held)."""
        ...


@runtime_checkable
class CancelFeed(Protocol):
    """A store that can tell the owner of a turn of a cancel request as it is made.

    Optional: without it, owners find requests by polling :meth:`TurnLog.cancel_requests`. With
    it (PostgreSQL ``LISTEN/NOTIFY``), a request reaches the owning process in one round trip.
    """

    async def listen_cancels(
        self,
        heard: Callable[[str], None],
        ready: Callable[[], None],
        queued: Callable[[SessionKey | None], None] | None = None,
    ) -> None:
        """Call ``ready()`` once listening, then ``heard(turn_id)`` for every request, until the
        link drops; then return or raise.

        With ``queued``, also ``queued(key)`` for every turn queued on a session whose lease is
        held by another process than the one that submitted it (``enqueue_turn``'s ``by``), and
        whenever a turn that kept queued ones waiting ends or is decided: the holder's worker,
        lingering on the lease, then need not poll the queue. ``queued(None)`` stands for a
        session whose key could not be sent: the holder looks at every session it holds.
        """
        ...


@runtime_checkable
class OwnThread(Protocol):
    """A store whose calls run on one thread of its own, which shares the interpreter's lock
    with the event loop's thread."""

    def thread_id(self) -> int | None:
        """That thread's native id (None while the store is not open)."""
        ...
