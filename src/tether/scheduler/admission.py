"""How a submitted turn gets into the store: the admission, and what it may do at once.

The plain way queues the turn (:meth:`TurnLog.enqueue_turn`), with the session's lease for
this process when the store can grant it in the same write and the session was idle
(:class:`LeasingQueue`). When this process's worker already holds the session's lease, the
turn is admitted under that lease and, with nothing ahead of it, started in the same write
(:class:`StartingQueue`); the worker keeps the lease until that write has settled and runs
the turn without a start of its own. A turn for the session's own agent reads the session
for its name at most once a lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tether.errors import (
    AgentChanged,
    NotFound,
    QueueFull,
    SessionNotFound,
    ShuttingDown,
    StaleLease,
)
from tether.events import TURN_STARTED
from tether.records import (
    AgentRef,
    Idempotency,
    Item,
    Lease,
    NewEvent,
    NewItem,
    Policy,
    PrincipalLimits,
    SessionKey,
    Turn,
)
from tether.scheduler.local import Admitted, Local
from tether.scheduler.worker import Workers
from tether.store.capabilities import ChangeCounter, LeasingQueue, StartingQueue
from tether.store.protocol import SessionReader, TurnLog
from tether.store.rules import request_digest

KNOWN_AGENTS = 10_000
"""Sessions whose own agent a process remembers (~200 bytes each)."""
SLOT_POLL = 0.5
"""Seconds between retries of a caller waiting for room in a full queue (another node may
free it without telling this one)."""


class AdmissionStore(SessionReader, TurnLog, Protocol):
    """What admitting a turn uses of the store."""


class Admission:
    """Admits the turns a scheduler is submitted (see the module's doc)."""

    def __init__(
        self,
        store: AdmissionStore,
        local: Local,
        workers: Workers,
        *,
        owner: str,
        lease_ttl: float,
        max_queue: int,
        limits: PrincipalLimits | None,
    ) -> None:
        self.store = store
        # Looked up once: a Protocol isinstance check walks its members, on every turn.
        self.counter = store if isinstance(store, ChangeCounter) else None
        self.leasing = store if isinstance(store, LeasingQueue) else None
        self.starting = store if isinstance(store, StartingQueue) else None
        self.local = local
        self.workers = workers
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.max_queue = max_queue
        self.limits = limits
        """Per-principal bounds applied when a turn is admitted (None: unbounded)."""
        self.known_agents: dict[SessionKey, str] = {}
        """The own agent of sessions read here (at most KNOWN_AGENTS, the oldest dropped
        first): a turn on one of them is admitted without a read, and the store confirms it."""

    async def enqueue(
        self, asked: Asked, wait: float, turn_id: str, news: tuple[str, int] | None
    ) -> tuple[Turn, Lease | None]:
        """The admitted turn, and the session's lease when the store took it for this
        process as it admitted the turn (the session was idle) and left it to the caller to
        hand to the session's worker (``news``: :meth:`Workers.news` before the admission)."""
        local, key, input, policy = self.local, asked.key, asked.input, asked.policy
        deadline = time.monotonic() + wait
        waiting = False
        try:
            while True:
                try:
                    lease = local.leases.get(key)
                    read: Chosen | None = None  # the session read for its agent: good anywhere
                    if lease is not None and self.may_start(key, lease, policy):
                        known = asked.agent_under(lease, local)
                        if known is None:
                            known = read = await self._agent(asked)
                        if self.may_start(key, lease, policy):
                            # The session's worker holds the lease here: admitted under that
                            # lease, the turn starts in the same write when nothing is ahead of
                            # it, without the worker's own start (or is queued behind, as
                            # usual). What was known of the session under the lease holds if
                            # the lease does.
                            try:
                                return await self._started(lease, asked, known.ref, turn_id), None
                            except StaleLease:
                                # Then as usual, below, reading the session afresh: it may
                                # have been deleted and made anew since the read above.
                                local.agents.pop(key, None)
                                self.known_agents.pop(key, None)
                                read = None
                    if self.starting is not None and policy in ("enqueue", "reject"):
                        taken = await self._take(asked, read, turn_id, news)
                        if taken is None:
                            continue  # the agent guessed is not the session's: read it now
                        return taken, None
                    agent = read or await self._agent(asked)
                    idempotency = asked.idempotency(agent.ref)
                    if self.leasing is not None:
                        return await self.leasing.enqueue_turn_leased(
                            key,
                            owner=self.owner,
                            ttl=self.lease_ttl,
                            turn_id=turn_id,
                            input=input,
                            policy=policy,
                            max_queue=self.max_queue,
                            agent=agent.ref,
                            limits=self.limits,
                            idempotency=idempotency,
                        )
                    turn = await self.store.enqueue_turn(
                        key,
                        turn_id=turn_id,
                        input=input,
                        policy=policy,
                        max_queue=self.max_queue,
                        agent=agent.ref,
                        limits=self.limits,
                        idempotency=idempotency,
                        by=self.owner,
                    )
                    return turn, None
                except QueueFull as full:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    if local.closing:
                        message = "the server is shutting down; retry on another node"
                        raise ShuttingDown(message) from full
                    if not waiting:
                        self._count_waiter(key, wait, full)
                        waiting = True
                    freed = local.slot_freed.setdefault(key, asyncio.Event())
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, SLOT_POLL)):
                            await freed.wait()
        finally:
            if waiting:
                left = local.slot_waiters[key] - 1
                if left:
                    local.slot_waiters[key] = left
                else:
                    del local.slot_waiters[key]

    def _count_waiter(self, key: SessionKey, wait: float, full: QueueFull) -> None:
        """Count a caller among those waiting for room in ``key``'s full queue; ``full`` again
        when a finite wait would make more of them than the queue holds."""
        local = self.local
        if wait != math.inf and local.slot_waiters.get(key, 0) >= self.max_queue:
            raise full
        local.slot_waiters[key] = local.slot_waiters.get(key, 0) + 1

    async def _agent(self, asked: Asked) -> Chosen:
        """The turn's agent, the session's read for it when the caller named none (noted for
        the lease held here, if one is held throughout the read)."""
        if asked.agent is not None or asked.own_agent is None:
            return Chosen(asked.agent)
        lease = self.local.leases.get(asked.key)
        record = await self.store.get_session(asked.key)
        if record is None or record.expired():
            self.known_agents.pop(asked.key, None)
            raise SessionNotFound("session not found")
        if lease is not None and self.local.leases.get(asked.key) is lease:
            self.local.agents[asked.key] = (lease, record.agent)
        self.remember(asked.key, record.agent)
        # Expected too: an admission that takes the lease confirms it, so what it says holds
        # under that lease (a session made anew since the read is read again).
        return Chosen(asked.own_agent(record.agent), record.agent)

    def remember(self, key: SessionKey, agent: str) -> None:
        """Note ``agent`` as ``key``'s own agent (the newest note, the last to be dropped)."""
        known = self.known_agents
        known.pop(key, None)
        if len(known) >= KNOWN_AGENTS:
            del known[next(iter(known))]
        known[key] = agent

    def _guess(self, asked: Asked) -> Chosen | None:
        """The turn's agent as the session's agent was last read here, to be confirmed by the
        admission (``Chosen.expected``); None when the session must be read for it."""
        if asked.agent is not None or asked.own_agent is None:
            return Chosen(asked.agent)
        name = self.known_agents.get(asked.key)
        if name is None:
            return None
        try:
            return Chosen(asked.own_agent(name), name)
        except NotFound:
            return None  # not served here (or no longer what the session names): read it

    def may_start(self, key: SessionKey, lease: Lease | None, policy: Policy) -> bool:
        """Whether a turn on ``key`` may be admitted under ``lease``, to start at once when
        nothing is ahead of it: the store can, the session's worker here holds that lease, and
        no other such admission is in flight. (Interrupt and rollback go the usual way, with
        their preemption.)"""
        local = self.local
        return (
            self.starting is not None
            and lease is not None
            and local.leases.get(key) is lease
            and key not in local.claims
            and policy in ("enqueue", "reject")
        )

    async def _started(
        self, lease: Lease, asked: Asked, agent: AgentRef | None, turn_id: str
    ) -> Turn:
        """:meth:`StartingQueue.enqueue_turn_started` under the worker's ``lease``, which the
        worker keeps until the write has settled, and then runs the turn if it started."""
        local, key, starting = self.local, lease.key, self.starting
        assert starting is not None
        # Before the write: a cancel from another process rings after the turn is running.
        rings = self.counter.heard() if self.counter is not None else None
        claim = local.claims[key] = asyncio.Event()
        write = asyncio.ensure_future(
            starting.enqueue_turn_started(
                lease,
                turn_id=turn_id,
                input=asked.input,
                policy=asked.policy,
                items=[NewItem("user", asked.input)],
                events=[NewEvent(2, TURN_STARTED, {"turn_id": turn_id})],
                max_queue=self.max_queue,
                agent=agent,
                limits=self.limits,
                idempotency=asked.idempotency(agent),
            )
        )

        gone = False  # the caller was cancelled before it had the outcome

        def settled(done: asyncio.Future[tuple[Turn, list[Item] | None]]) -> None:
            # In a callback, not after the await: a caller that goes away meanwhile (a client
            # disconnecting cancels its request) must not leave a started turn nobody runs.
            if not done.cancelled() and done.exception() is None:
                turn, items = done.result()
                if items is not None and turn.id == turn_id:
                    local.waiters.setdefault(turn.id, (key, []))
                    local.started[key] = (turn, Admitted(items[0], lease, rings))
                elif gone and turn.id == turn_id:
                    self.workers.kick(key, turn)  # queued behind another: as submit would
            if local.claims.get(key) is claim:
                del local.claims[key]
            claim.set()
            self.workers.wake(key)

        write.add_done_callback(settled)
        try:
            turn, _ = await asyncio.shield(write)
        except asyncio.CancelledError:
            gone = True
            if write.done() and not write.cancelled() and write.exception() is None:
                queued, items = write.result()
                if items is None and queued.id == turn_id:
                    self.workers.kick(key, queued)  # settled before the caller went away
            raise
        return turn

    async def _take(
        self, asked: Asked, read: Chosen | None, turn_id: str, news: tuple[str, int] | None
    ) -> Turn | None:
        """:meth:`_taken` for the agent ``read``, or else guessed from an earlier read, or
        else read now; None when the store found the guess wrong (nothing was written)."""
        agent = read or self._guess(asked) or await self._agent(asked)
        try:
            return await self._taken(asked, agent, asked.idempotency(agent.ref), turn_id, news)
        except AgentChanged:
            self.known_agents.pop(asked.key, None)
            return None
        except SessionNotFound:
            self.known_agents.pop(asked.key, None)
            raise

    async def _taken(
        self,
        asked: Asked,
        agent: Chosen,
        idempotency: Idempotency | None,
        turn_id: str,
        news: tuple[str, int] | None,
    ) -> Turn:
        """:meth:`StartingQueue.enqueue_turn_taken`: the turn admitted with the session's lease
        when it is free, and started under it when nothing is ahead of it. The lease, and the
        turn if it started, go to the session's worker as the write settles."""
        local, key, starting = self.local, asked.key, self.starting
        assert starting is not None
        # Before the write: a cancel from another process rings after the turn is running.
        rings = self.counter.heard() if self.counter is not None else None
        write = asyncio.ensure_future(
            starting.enqueue_turn_taken(
                key,
                owner=self.owner,
                ttl=self.lease_ttl,
                turn_id=turn_id,
                input=asked.input,
                policy=asked.policy,
                items=[NewItem("user", asked.input)],
                events=[NewEvent(2, TURN_STARTED, {"turn_id": turn_id})],
                max_queue=self.max_queue,
                agent=agent.ref,
                limits=self.limits,
                idempotency=idempotency,
                expect_agent=agent.expected,
            )
        )
        gone = False  # the caller was cancelled before it had the outcome

        def settled(done: asyncio.Future[tuple[Turn, Lease | None, list[Item] | None]]) -> None:
            # In a callback, not after the await: a caller that goes away meanwhile (a client
            # disconnecting cancels its request) must not leave a lease taken, or a turn
            # started, that nobody here uses.
            if done.cancelled() or done.exception() is not None:
                return
            turn, lease, items = done.result()
            if turn.id != turn_id:
                return  # a retry's turn, as it stands: nothing taken, nothing to run
            if lease is None:
                if gone:
                    self.workers.kick(key, turn)  # queued behind another: as submit would
                return
            if agent.expected is not None:
                # Confirmed by the write that took the lease: it holds under that lease.
                local.agents[key] = (lease, agent.expected)
            if items is not None:
                local.waiters.setdefault(turn.id, (key, []))
                local.started[key] = (turn, Admitted(items[0], lease, rings))
                self.workers.kick(key, None, lease, news)
            else:
                local.waiters.setdefault(turn.id, (key, []))
                self.workers.kick(key, turn, lease, news)  # turns left before it come first

        write.add_done_callback(settled)
        local.taking.add(write)
        write.add_done_callback(local.taking.discard)  # after settled: its worker is known then
        try:
            turn, _, _ = await asyncio.shield(write)
        except asyncio.CancelledError:
            gone = True
            if write.done() and not write.cancelled() and write.exception() is None:
                queued, lease, _ = write.result()
                if lease is None and queued.id == turn_id:
                    self.workers.kick(key, queued)  # settled before the caller went away
            raise
        return turn


@dataclass(frozen=True, slots=True)
class Chosen:
    """The agent a turn is admitted for (None: the session's, resolved where it runs)."""

    ref: AgentRef | None
    expected: str | None = None
    """The session's own agent as last read here (not read for this turn): the admission
    confirms it, or refuses with AgentChanged."""


@dataclass(frozen=True, slots=True)
class Asked:
    """What a submission asks, as :meth:`Scheduler.submit` took it."""

    key: SessionKey
    input: str
    policy: Policy
    agent: AgentRef | None
    own_agent: Callable[[str], AgentRef] | None
    idempotency_key: str | None

    def agent_under(self, lease: Lease, local: Local) -> Chosen | None:
        """The turn's agent if it is known without a read while ``lease`` is held; None if
        the session must be read for it."""
        if self.agent is not None or self.own_agent is None:
            return Chosen(self.agent)
        known = local.agents.get(self.key)
        if known is None or known[0] is not lease:
            return None
        return Chosen(self.own_agent(known[1]))

    def idempotency(self, agent: AgentRef | None) -> Idempotency | None:
        if self.idempotency_key is None:
            return None
        return Idempotency(self.idempotency_key, request_digest(self.input, self.policy, agent))
