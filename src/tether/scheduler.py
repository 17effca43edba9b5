"""One turn at a time per session, on any number of processes.

How it holds together:

* A turn is accepted by :meth:`Scheduler.submit`, which queues it in the store (one transaction
  that also applies the policy: reject, queue bound). Order is the turn's ``seq``.
* Each session with work has at most one *worker* task in this process. The worker takes the
  session's lease (a fencing token incremented on every acquisition), ends any turn a dead
  owner left ``running`` (``failed``/``owner_lost``), then runs queued turns in ``seq`` order
  until none is left, and releases the lease.
* Every write a turn makes is fenced by that lease in the store itself, so a worker that lost its
  lease (paused past expiry, say) cannot write, even if it does not know yet.
* One heartbeat task renews all leases this process holds; a lease it fails to renew is lost and
  the turn under it is stopped without writing anything more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Literal

from tether import chores
from tether.agent import Agent
from tether.chores import RunningTurn
from tether.errors import QueueFull, SessionNotFound, ShuttingDown, StaleLease, TurnNotFound
from tether.feeds import TurnFeed, follow_turn
from tether.leases import new_owner_id, owner_is_dead
from tether.loop.context import TurnContext
from tether.loop.run import run_turn
from tether.memory.service import MemoryService
from tether.memory.tools import memory_tools
from tether.memory.turn import TurnMemory
from tether.models import resolve_model
from tether.records import (
    LOCAL_PRINCIPAL,
    CancelStatus,
    Event,
    Lease,
    NewItem,
    Policy,
    Principal,
    Reason,
    SessionKey,
    Turn,
    TurnEnding,
    new_turn_id,
)
from tether.runner import FencedSink, StoreHistory
from tether.store.protocol import Store
from tether.store.rules import DEFAULT_MAX_QUEUE, terminal_event_data
from tether.tools.approval import Approver

log = logging.getLogger("tether.scheduler")

AgentResolver = Callable[[str], Agent | None]

CANCEL_POLL = 0.025
"""Seconds between reads of cancel requests while this process runs turns."""
CANCEL_FALLBACK = 1.0
"""The same with a store that announces requests (PostgreSQL LISTEN/NOTIFY): a safety net."""
LINGER_POLL = 0.05
"""Seconds between looks at the store for turns accepted elsewhere while a lease lingers."""
CROSS_PROCESS_POLL = 0.25
"""Seconds between store reads while waiting on a turn that another process may be running."""


class Scheduler:
    def __init__(
        self,
        store: Store,
        agents: AgentResolver,
        *,
        node: str | None = None,
        lease_ttl: float = 30.0,
        max_queue: int = DEFAULT_MAX_QUEUE,
        approver: Approver | None = None,
        workspace_root: Path | None = None,
        default_model: str | None = None,
        linger: float = 0.25,
        memory: MemoryService | None = None,
    ) -> None:
        self.store = store
        self.memory = memory
        self._agents = agents
        self.owner = new_owner_id(node)
        self.lease_ttl = lease_ttl
        self.max_queue = max_queue
        self.approver = approver
        self.workspace_root = workspace_root
        self.default_model = default_model
        self._workers: dict[SessionKey, asyncio.Task[None]] = {}
        self._dirty: set[SessionKey] = set()
        self._leases: dict[SessionKey, Lease] = {}
        self._running: dict[str, RunningTurn] = {}
        self._feeds: dict[str, TurnFeed] = {}
        # Turns accepted here and not yet ended: their key (so a caller naming the turn under
        # another key learns nothing) and the futures of callers waiting for the end.
        self._waiters: dict[str, tuple[SessionKey, list[asyncio.Future[Turn]]]] = {}
        self._slot_freed: dict[SessionKey, asyncio.Event] = {}
        self._slot_waiters: dict[SessionKey, int] = {}
        self._kicked: dict[SessionKey, asyncio.Event] = {}
        self.linger = linger
        self._principals: dict[SessionKey, Principal] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._adopter: asyncio.Task[None] | None = None
        self.sweep_interval = 60.0
        self._closing = False

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin heartbeats and pick up work left by a previous life of this store."""
        self._heartbeat = asyncio.create_task(
            chores.heartbeat(self.store, self._leases, self._running, self.lease_ttl),
            name="tether-heartbeat",
        )
        self._watcher = asyncio.create_task(
            chores.watch_cancels(
                self.store, self._running, CANCEL_POLL, fallback_interval=CANCEL_FALLBACK
            ),
            name="tether-cancels",
        )
        self._sweeper = asyncio.create_task(
            chores.sweep_expired(self.store, lambda: self.sweep_interval), name="tether-sweeper"
        )
        self._adopter = asyncio.create_task(
            chores.adopt_orphans(
                self.store, self._workers, self._kick, self.lease_ttl, lambda: self._closing
            ),
            name="tether-orphans",
        )
        for key in await self.store.sessions_needing_work():
            self._kick(key)

    async def close(self, drain_timeout: float = 10.0) -> None:
        """Stop taking turns; let running ones finish up to ``drain_timeout``, then cancel them."""
        # Safe to call again while a first call drains (the server starts draining when the
        # shutdown signal arrives, and its lifespan closes the runtime later): every call waits
        # for the same worker tasks.
        self._closing = True
        for kicked in self._kicked.values():
            kicked.set()  # lingering workers give their leases up now
        workers = [w for w in self._workers.values() if not w.done()]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=drain_timeout)
            if pending:
                for running in list(self._running.values()):
                    running.ctx.request_cancel("cancelled", "shutdown")
                _, stuck = await asyncio.wait(pending, timeout=5.0)
                for task in stuck:
                    task.cancel()
                if stuck:
                    # The store closes after this returns: let the workers unwind first.
                    await asyncio.wait(stuck, timeout=1.0)
        for background in (self._heartbeat, self._watcher, self._sweeper, self._adopter):
            if background is not None:
                background.cancel()
                await asyncio.gather(background, return_exceptions=True)

    # -- submitting ------------------------------------------------------------------------------
    async def submit(
        self,
        key: SessionKey,
        input: str,
        *,
        policy: Policy = "enqueue",
        principal: Principal | None = None,
        wait_for_slot: float = 0.0,
    ) -> Turn:
        """Queue a turn.

        When the session's queue is full, a caller that is going to wait for the turn anyway
        may wait up to ``wait_for_slot`` seconds for room (backpressure) instead of getting
        QueueFull at once. Callers with a finite wait (requests) are bounded too, at
        ``max_queue`` per session, so a flood of requests cannot pile up without limit; an
        infinite wait is for in-process callers, each of which is already a blocked caller.
        """
        if self._closing:
            raise ShuttingDown("the server is shutting down; retry on another node")
        if principal is not None:
            self._principals[key] = principal
        deadline = time.monotonic() + wait_for_slot
        waiting = False
        try:
            while True:
                try:
                    turn = await self.store.enqueue_turn(
                        key,
                        turn_id=new_turn_id(),
                        input=input,
                        policy=policy,
                        max_queue=self.max_queue,
                    )
                    break
                except QueueFull:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    if not waiting:
                        bounded = wait_for_slot != math.inf
                        if bounded and self._slot_waiters.get(key, 0) >= self.max_queue:
                            raise
                        self._slot_waiters[key] = self._slot_waiters.get(key, 0) + 1
                        waiting = True
                    freed = self._slot_freed.setdefault(key, asyncio.Event())
                    # Also wake periodically: another node may free the slot.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, 0.5)):
                            await freed.wait()
        finally:
            if waiting:
                left = self._slot_waiters[key] - 1
                if left:
                    self._slot_waiters[key] = left
                else:
                    del self._slot_waiters[key]
        self._waiters.setdefault(turn.id, (key, []))
        if policy == "interrupt" or policy == "rollback":
            await self._preempt(key, policy)
        self._kick(key)
        return turn

    async def _preempt(self, key: SessionKey, policy: Literal["interrupt", "rollback"]) -> None:
        """End the session's running turn for a newer one (policy interrupt or rollback).

        The reason is the policy's name: a stable code, as every reason is.
        """
        status: CancelStatus = "interrupted" if policy == "interrupt" else "rolled_back"
        reason: Reason = policy
        local = [r for r in self._running.values() if r.turn.key == key]
        for running in local:
            running.ctx.request_cancel(status, reason)
        if not local:
            # Running in another process (or about to be registered here): ask through the
            # store; its owner polls for requests and ends the turn itself.
            for turn in await self.store.active_turns(key):
                if turn.status == "running":
                    await self.store.request_cancel(key, turn.id, status, reason)

    def _kick(self, key: SessionKey) -> None:
        worker = self._workers.get(key)
        if worker is not None and not worker.done():
            self._dirty.add(key)  # the worker re-reads the queue before it gives up the session
            kicked = self._kicked.get(key)
            if kicked is not None:
                kicked.set()
            return
        self._workers[key] = asyncio.create_task(self._work(key), name="tether-worker")

    # -- the per-session worker ----------------------------------------------------------------
    async def _work(self, key: SessionKey) -> None:
        try:
            while True:
                lease = await self._acquire(key)
                if lease is None:
                    return  # nothing left to do, or the session is gone
                self._leases[key] = lease
                try:
                    await self._drain(key, lease)
                    while await self._linger(key):
                        await self._drain(key, lease)
                except StaleLease:
                    log.warning("lost the lease of a session mid-turn; stopped without writing")
                finally:
                    self._leases.pop(key, None)
                    await self._release(lease)
                # No await between this check and leaving _workers: a submit that lands after
                # it sees no worker and starts a new one; one that landed before set _dirty.
                if key in self._dirty:
                    self._dirty.discard(key)
                    continue
                self._workers.pop(key, None)
                self._principals.pop(key, None)
                return
        except asyncio.CancelledError:
            self._workers.pop(key, None)
            raise
        except Exception:
            log.exception("session worker failed")
            self._workers.pop(key, None)

    @property
    def closing(self) -> bool:
        """True once close() has begun: no new turns are taken."""
        return self._closing

    async def _linger(self, key: SessionKey) -> bool:
        """Keep the lease a moment after the queue empties; True if a new turn came in.

        A conversation's next turn often follows within moments: holding on saves taking and
        giving up the lease (two write transactions) per turn. Turns submitted in this process
        wake the worker at once; turns accepted by another process (a load balancer spreading
        one session over several nodes) are seen by a look at the store every LINGER_POLL, so
        they do not wait for the linger to run out.
        """
        if self._closing or self.linger <= 0:
            return False
        if key in self._dirty:
            return True
        kicked = self._kicked[key] = asyncio.Event()
        deadline = time.monotonic() + self.linger
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, LINGER_POLL)):
                        await kicked.wait()
                closing = self.closing  # re-read: close() may have run while we waited
                if key in self._dirty:
                    return not closing
                if closing:
                    return False  # close() set the event to end lingering
                try:
                    active = await self.store.active_turns(key)
                except SessionNotFound:
                    return False  # deleted (or forgotten) while we lingered
                if any(t.status == "queued" for t in active):
                    return True  # accepted elsewhere: run it while we hold the session
        finally:
            self._kicked.pop(key, None)

    async def _release(self, lease: Lease) -> None:
        try:
            await self.store.release_lease(lease)
        except Exception:
            log.exception("could not release a lease; it will expire")

    async def _acquire(self, key: SessionKey) -> Lease | None:
        delay = 0.02
        while True:
            try:
                lease = await self.store.acquire_lease(key, self.owner, self.lease_ttl)
                if lease is None:
                    holder = await self.store.lease_holder(key)
                    if holder is not None and owner_is_dead(holder):
                        lease = await self._take_over(key, holder)
            except SessionNotFound:
                return None
            if lease is not None:
                return lease
            # Another live process holds the session; it will run the queue. Wait while there
            # is still work, in case it dies or releases the lease with turns left.
            if not await self.store.active_turns(key):
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _take_over(self, key: SessionKey, holder: str) -> Lease | None:
        lease = await self.store.take_over_lease(key, self.owner, self.lease_ttl, holder)
        if lease is not None:
            log.warning("took over the lease of a dead process (%s)", holder)
        return lease

    async def _drain(self, key: SessionKey, lease: Lease) -> None:
        for turn in await self.store.recover(lease):
            log.warning("turn %s ended failed/owner_lost: its process died", turn.id)
            self._resolve(turn)
        record = None  # read once per lease: a session's agent does not change under it
        while True:
            self._dirty.discard(key)
            active = await self.store.active_turns(key)
            queued = [t for t in active if t.status == "queued"]
            if not queued:
                return
            if self._closing:
                return
            if record is None:
                record = await self.store.get_session(key)
            await self._run(lease, queued[0], record.agent if record is not None else None)

    async def _run(self, lease: Lease, turn: Turn, agent_name: str | None) -> None:
        key = turn.key
        agent = self._agents(agent_name) if agent_name is not None else None
        feed = TurnFeed(turn.id)
        self._feeds[turn.id] = feed
        sink = FencedSink(self.store, lease, turn.id, feed)
        try:
            user_item = await sink.start(turn.input)
            if agent is None:
                ending = TurnEnding(
                    "failed",
                    "agent_not_found",
                    error=f"agent {agent_name or '?'} is not served",
                )
                done = await self._end(sink, turn, ending, [])
                return
            ctx = TurnContext(
                agent=agent,
                model=resolve_model(agent.model if agent.model is not None else self.default_model),
                key=key,
                principal=self._principals.get(key) or _principal_of(key),
                turn_id=turn.id,
                input=turn.input,
                input_seq=user_item.seq,
                history=StoreHistory(self.store, key),
                sink=sink,
                approver=self.approver,
                workspace=self.workspace_root / key.tenant / key.owner / key.session_id
                if self.workspace_root
                else None,
            )
            if self.memory is not None:
                # Memory belongs to the session's owner (embedded use may act for a user_id
                # other than the caller's principal), with the caller's roles.
                owner = Principal(key.tenant, key.owner, ctx.principal.roles)
                ctx.memory = TurnMemory(self.memory, owner, key, agent.name, agent.memory, turn.id)
                ctx.extra_tools = memory_tools(agent.memory.remember, agent.memory.knowledge_tool)
            self._running[turn.id] = RunningTurn(turn, ctx)
            try:
                result = await run_turn(ctx)
            finally:
                self._running.pop(turn.id, None)
            done = await self._end(sink, turn, result.ending, result.items)
            if done.status == "rolled_back" and ctx.memory is not None:
                await self._forget_turn_memory(ctx.memory)
        except StaleLease:
            raise
        finally:
            sink.close()
            feed.close()
            self._feeds.pop(turn.id, None)
            freed = self._slot_freed.pop(key, None)
            if freed is not None:
                freed.set()
        self._resolve(done)

    @staticmethod
    async def _forget_turn_memory(memory: TurnMemory) -> None:
        # A rolled-back turn leaves no trace in history; what it noted goes with it.
        try:
            await memory.forget_turn()
        except Exception:
            log.warning("could not remove the memory of a rolled-back turn", exc_info=True)

    async def _end(
        self, sink: FencedSink, turn: Turn, ending: TurnEnding, items: list[NewItem]
    ) -> Turn:
        return await sink.end(ending, items, terminal_event_data(turn.id, ending))

    def _resolve(self, turn: Turn) -> None:
        _, futures = self._waiters.pop(turn.id, (turn.key, []))
        for fut in futures:
            if not fut.done():
                fut.set_result(turn)

    # -- waiting, cancelling, following ----------------------------------------------------------
    async def wait(self, key: SessionKey, turn_id: str) -> Turn:
        """The turn once it has ended (bound it with ``asyncio.timeout``)."""
        read_store = turn_id not in self._waiters
        while True:
            if read_store:
                turn = await self.store.get_turn(key, turn_id)
                if turn is None:
                    raise TurnNotFound("turn not found")
                if turn.ended:
                    self._resolve(turn)  # ended by another process: release local waiters
                    return turn
            local = self._waiters.get(turn_id)
            if local is None or local[0] != key:
                # Not accepted here (or not under this key): poll the store.
                read_store = True
                await asyncio.sleep(0.05)
                continue
            # Accepted here and not ended. If this process runs it, its end resolves the
            # future at once; if another process holds the session (several processes on one
            # store), only the store will tell, so look there now and then too.
            fut: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
            local[1].append(fut)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CROSS_PROCESS_POLL):
                    return await asyncio.shield(fut)
            if fut.done():
                return fut.result()
            with contextlib.suppress(ValueError):
                local[1].remove(fut)
            read_store = True

    async def cancel(self, key: SessionKey, turn_id: str, reason: Reason = "cancelled") -> Turn:
        """Cancel a queued or running turn; an ended turn is returned as it is."""
        turn = await self.store.get_turn(key, turn_id)
        if turn is None:
            raise TurnNotFound("turn not found")
        if turn.status == "queued":
            ended = await self.store.cancel_queued_turn(key, turn_id, reason)
            if ended is not None:
                self._resolve(ended)
                return ended
        running = self._running.get(turn_id)
        if running is not None:
            running.ctx.request_cancel("cancelled", reason)
        else:
            # Running in another process, or started here a moment ago: the request goes
            # through the store, where the owner's watcher finds it.
            await self.store.request_cancel(key, turn_id, "cancelled", reason)
        return await self.wait(key, turn_id)

    def events(
        self, key: SessionKey, turn_id: str, after_seq: int = 0
    ) -> AsyncGenerator[Event, None]:
        """The turn's events after ``after_seq``: replayed, then followed live until the end."""
        return follow_turn(
            self.store, self._feeds, key, turn_id, after_seq, closing=lambda: self._closing
        )

    def running_turns(self) -> list[Turn]:
        return [r.turn for r in self._running.values()]


def _principal_of(key: SessionKey) -> Principal:
    if key.tenant == LOCAL_PRINCIPAL.tenant and key.owner == LOCAL_PRINCIPAL.user:
        return LOCAL_PRINCIPAL
    return Principal(key.tenant, key.owner)


def now() -> float:
    return time.time()
