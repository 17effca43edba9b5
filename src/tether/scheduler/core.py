"""One turn at a time per session, on any number of processes.

How it holds together:

* A turn is accepted by :meth:`Scheduler.submit`, which queues it in the store (one transaction
  that also applies the policy: reject, queue bound; :mod:`.admission`, which may also take
  the session's lease or start the turn in it). Order is the turn's ``seq``.
* A session with work gets a worker in this process (:mod:`.worker`) that holds the session's
  lease while it runs the queue, one turn at a time (:mod:`.turn`).
* Background chores (:mod:`.chores`) renew the leases this process holds, apply cancel
  requests other processes leave for its turns, sweep expired sessions and adopt orphaned work.
* Callers wait for a turn's end (:meth:`wait`), cancel it (:meth:`cancel`) or follow its events
  (:meth:`events`) from any process: what this process knows (:mod:`.local`) answers at once,
  the store answers the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from tether.errors import ShuttingDown, TurnNotFound
from tether.memory.service import MemoryService
from tether.records import (
    AgentRef,
    CancelStatus,
    Decision,
    DecisionStatus,
    Event,
    Lease,
    Policy,
    Principal,
    PrincipalLimits,
    Reason,
    SessionKey,
    SessionRecord,
    Turn,
    Verdict,
    check_submission,
    new_turn_id,
)
from tether.scheduler import chores
from tether.scheduler.admission import Admission, Asked
from tether.scheduler.feeds import follow_turn
from tether.scheduler.local import Local
from tether.scheduler.news import StoreNews
from tether.scheduler.owners import new_owner_id
from tether.scheduler.runner import AgentResolver, AutoNotes, TurnRunner, TurnStore
from tether.scheduler.worker import Workers, WorkerStore
from tether.store.capabilities import ChangeCounter, ReleasingEnd
from tether.store.protocol import DecisionStore, Maintenance, TurnLog
from tether.store.rules import DEFAULT_MAX_QUEUE
from tether.tools import workspace
from tether.tools.mcp import McpSessions
from tether.tools.workspace import DEFAULT_QUOTA_BYTES

log = logging.getLogger(__name__)

CANCEL_POLL = 0.025
"""Seconds between reads of cancel requests while this process runs turns."""
CANCEL_FALLBACK = 1.0
"""The same with a store that announces requests (PostgreSQL LISTEN/NOTIFY): a safety net."""
CROSS_PROCESS_POLL = 0.02
"""Seconds between looks at the store while waiting on a turn another process may be running:
with a :class:`ChangeCounter` (SQLite), a look at its version, and a read only when it moved.
When other processes ring the store (its doorbell), a look only when rung, no more often than
this (:class:`~tether.scheduler.news.StoreNews`)."""
CROSS_PROCESS_READ = 0.1
"""The same for a store without one: each look reads the turn."""
NOT_HERE_POLL = 0.05
"""The same for a turn accepted by another process: each look reads it."""
LOCAL_SAFETY = 1.0
"""The same while this process holds the session's lease, so the turn's end comes here as a
signal: a read now and then, in case the lease was lost."""
LINGER = 0.25
"""Seconds a worker keeps a session's lease after its queue empties, by default, with a store
that cannot give it up with a turn's ending (:class:`ReleasingEnd`); 0 with one."""
PREEMPT_ROUNDS = 64
"""Looks at the turns ahead of an interrupting one: each round after the first follows a turn
that a worker moved meanwhile, which each turn does once."""


class SchedulerStore(WorkerStore, TurnStore, TurnLog, DecisionStore, Maintenance, Protocol):
    """Everything the scheduler's parts use of the store (not keys, not memory)."""


class Scheduler:
    def __init__(
        self,
        store: SchedulerStore,
        agents: AgentResolver,
        *,
        node: str | None = None,
        lease_ttl: float = 30.0,
        max_queue: int = DEFAULT_MAX_QUEUE,
        workspace_root: Path | None = None,
        workspace_quota: int = DEFAULT_QUOTA_BYTES,
        default_model: str | None = None,
        linger: float | None = None,
        memory: MemoryService | None = None,
        auto_notes: AutoNotes = "default",
        limits: PrincipalLimits | None = None,
        mcp: McpSessions | None = None,
    ) -> None:
        self.store = store
        # Looked up once: a Protocol isinstance check walks its members, on every turn.
        self._counter = store if isinstance(store, ChangeCounter) else None
        self.owner = new_owner_id(node)
        self.lease_ttl = lease_ttl
        self.local = Local()
        self.workspace_root = workspace_root
        self.runner = TurnRunner(
            store,
            self.local,
            agents,
            workspace_root=workspace_root,
            workspace_quota=workspace_quota,
            default_model=default_model,
            memory=memory,
            auto_notes=auto_notes,
            mcp=mcp,
        )
        self.mcp = mcp
        """The sessions' MCP connections in this process; swept sessions' are closed."""
        if linger is None:
            # A store that gives the lease up with a turn's ending (and takes it with the next
            # turn's admission) would save no write by keeping it: a lease lingers elsewhere.
            linger = 0.0 if isinstance(store, ReleasingEnd) else LINGER
        self.workers = Workers(
            store, self.local, self.runner, owner=self.owner, lease_ttl=lease_ttl, linger=linger
        )
        self.admission = Admission(
            store,
            self.local,
            self.workers,
            owner=self.owner,
            lease_ttl=lease_ttl,
            max_queue=max_queue,
            limits=limits,
        )
        self.sweep_interval = 60.0
        self._chores: list[asyncio.Task[None]] = []

    @property
    def linger(self) -> float:
        """Seconds a worker keeps a session's lease after its queue empties."""
        return self.workers.linger

    @linger.setter
    def linger(self, seconds: float) -> None:
        self.workers.linger = seconds

    @property
    def max_queue(self) -> int:
        """Turns a session may have waiting, the running one included."""
        return self.admission.max_queue

    @property
    def limits(self) -> PrincipalLimits | None:
        """Per-principal bounds applied when a turn is admitted (None: unbounded)."""
        return self.admission.limits

    @property
    def closing(self) -> bool:
        """True once close() has begun: no new turns are taken."""
        return self.local.closing

    def noted(self, record: SessionRecord) -> None:
        """A session made or read here: its agent is remembered for its turns' admissions,
        which confirm it (a session made anew since for another agent is read again)."""
        self.admission.remember(record.key, record.agent)

    def lease_of(self, key: SessionKey) -> Lease | None:
        """The lease this process holds on ``key`` now, if any."""
        return self.local.leases.get(key)

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Begin the background chores and pick up work left by a previous life of this store."""
        local, store = self.local, self.store
        self._chores = [
            asyncio.create_task(
                chores.heartbeat(store, local.leases, local.running, self.lease_ttl),
                name="tether-heartbeat",
            ),
            asyncio.create_task(
                chores.watch_cancels(
                    store,
                    local.running,
                    CANCEL_POLL,
                    fallback_interval=CANCEL_FALLBACK,
                    queued=self.workers.heard_queued,
                    feed=self.workers.feed_changed,
                ),
                name="tether-cancels",
            ),
            asyncio.create_task(
                chores.sweep_expired(
                    store,
                    lambda: self.sweep_interval,
                    self._swept,
                ),
                name="tether-sweeper",
            ),
            asyncio.create_task(
                chores.expire_decisions(store, self.workers.kick, local.decision_asked),
                name="tether-decisions",
            ),
            asyncio.create_task(
                chores.adopt_orphans(
                    store, local.workers, self.workers.kick, self.lease_ttl, lambda: self.closing
                ),
                name="tether-orphans",
            ),
        ]
        for key in await store.sessions_needing_work():
            self.workers.kick(key)

    async def _swept(self, keys: Sequence[SessionKey]) -> None:
        """What expired sessions had outside the store: their MCP servers, their workspaces."""
        if self.mcp is not None:
            await self.mcp.close_sessions(keys)
        await workspace.discard(self.workspace_root, keys)

    async def close(self, drain_timeout: float = 10.0) -> None:
        """Stop taking turns; let running ones finish up to ``drain_timeout``, then cancel them."""
        # Safe to call again while a first call drains (the server starts draining when the
        # shutdown signal arrives, and its lifespan closes the runtime later): every call waits
        # for the same worker tasks.
        local = self.local
        local.closing = True
        for kicked in local.kicked.values():
            kicked.set()  # lingering workers give their leases up now
        if local.taking:
            # An admission in flight may yet take a lease here and start a turn under it, for
            # a worker that starts as it settles: that worker is waited for too.
            await asyncio.wait(set(local.taking), timeout=drain_timeout)
        workers = [w for w in local.workers.values() if not w.done()]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=drain_timeout)
            if pending:
                for running in list(local.running.values()):
                    running.ctx.request_cancel("cancelled", "shutdown")
                _, stuck = await asyncio.wait(pending, timeout=5.0)
                for task in stuck:
                    task.cancel()
                if stuck:
                    # The store closes after this returns: let the workers unwind first.
                    await asyncio.wait(stuck, timeout=1.0)
        # Every turn that was to end here has ended, and its callers have it. Those still
        # waiting wait for turns queued behind (or on another process): this one will not run
        # them, and its store closes next. They are told so now (a 503 to an HTTP caller),
        # instead of polling a closed store until the server cuts them off.
        local.abandon(_shutting_down)
        for chore in self._chores:
            chore.cancel()
            await asyncio.gather(chore, return_exceptions=True)
        self._chores = []
        await self.workers.stop()

    # -- submitting ------------------------------------------------------------------------------
    async def submit(
        self,
        key: SessionKey,
        input: str,
        *,
        policy: Policy = "enqueue",
        principal: Principal | None = None,
        wait_for_slot: float = 0.0,
        agent: AgentRef | None = None,
        idempotency_key: str | None = None,
        own_agent: Callable[[str], AgentRef] | None = None,
    ) -> Turn:
        """Queue a turn for ``agent`` (None: the session's own agent, as served here).

        ``own_agent`` (with ``agent`` None): the turn is for the session's own agent, pinned
        as this maps its name (a fingerprint, AgentNotFound when it is not served). The name
        is read from the session, unless the worker here holds the session's lease and knows
        it already, and the turn is admitted under that lease (a session deleted and made
        anew since fails the lease's fence, and is read).

        When the session's queue is full, a caller that is going to wait for the turn anyway
        may wait up to ``wait_for_slot`` seconds for room (backpressure) instead of getting
        QueueFull at once. Callers with a finite wait (requests) are bounded too, at
        ``max_queue`` per session, so a flood of requests cannot pile up without limit; an
        infinite wait is for in-process callers, each of which is already a blocked caller.

        With ``idempotency_key``, a retry of a submission (same key, same request, within a
        day) returns the turn the first one made, whatever became of it, and starts nothing.
        """
        if self.closing:
            raise ShuttingDown("the server is shutting down; retry on another node")
        # Checked here, for every door: HTTP's schema checks the same, Python callers get this.
        check_submission(input, policy, idempotency_key)
        turn_id = new_turn_id()
        counter = self._counter
        before = (counter.seen_version(), counter.heard()) if counter is not None else None
        news = self.workers.news()
        asked = Asked(key, input, policy, agent, own_agent, idempotency_key)
        # Noted before the admission (a turn started with it may run before this goes on),
        # and dropped with a refused one when no worker here would ever drop it (a key of
        # no session's costs nothing to keep then).
        known = self.local.principals.get(key)
        if principal is not None:
            self.local.principals[key] = principal
        try:
            turn, lease = await self.admission.enqueue(asked, wait_for_slot, turn_id, news)
        except BaseException:
            if principal is not None and key not in self.local.workers:
                if known is None:
                    self.local.principals.pop(key, None)
                else:
                    self.local.principals[key] = known
            raise
        if turn.id != turn_id:
            return turn  # a retry of a submission: the turn its key made, as it stands
        if turn.status == "running":
            # Started as it was admitted, under the lease its worker holds here or the one the
            # admission took for it: the worker was told as the write settled (and the turn's
            # waiters noted then, before it could end), so there is nothing to kick; it may
            # even have ended by now.
            if before is not None and turn.id in self.local.waiters:
                self.local.accepted_at[turn.id] = before
            return turn
        self.local.waiters.setdefault(turn.id, (key, []))
        if before is not None:
            self.local.accepted_at[turn.id] = before
        try:
            if policy == "interrupt" or policy == "rollback":
                await self._preempt(key, policy, turn)
        finally:
            # Queued is queued: a caller that goes away while the turns ahead are ended (a
            # client disconnecting) leaves a turn that must still run.
            self.workers.kick(key, turn, lease, news)
        return turn

    async def _preempt(
        self, key: SessionKey, policy: Literal["interrupt", "rollback"], newer: Turn
    ) -> None:
        """End every turn of the session ahead of ``newer`` (policy interrupt or rollback), so
        that ``newer`` runs next (DESIGN §4): the one under way ends ``interrupted`` or
        ``rolled_back`` (running, or parked on a decision, which nobody runs, so it ends here);
        those queued behind it, never started, end ``cancelled``, with the policy as reason.

        A worker may move a turn meanwhile (start a queued one, resume a decided one): its
        ending here is then refused, and the turn is looked at again, running now, to be asked
        to stop. Each turn moves so once, so this ends.
        """
        status: CancelStatus = "interrupted" if policy == "interrupt" else "rolled_back"
        reason: Reason = policy
        for _ in range(PREEMPT_ROUNDS):
            moved = False
            ahead = [t for t in await self.store.active_turns(key) if t.seq < newer.seq]
            # The last first: the turns queued behind the one under way end before it is told
            # to stop, or its worker would start the next of them as soon as it had.
            for turn in reversed(ahead):
                if turn.status == "running":
                    await self._stop_running(key, turn.id, status, reason)
                    continue
                # Parked, decided and not yet resumed, or never started: nobody runs it now.
                ending: CancelStatus = status if turn.started_at is not None else "cancelled"
                ended = await self.store.end_waiting_turn(key, turn.id, reason, status=ending)
                if ended is None:
                    moved = True  # a worker started or resumed it meanwhile
                else:
                    self.local.resolve(ended)
            if not moved:
                return
        # Only a store that refuses to end a waiting turn it still lists as waiting gets here.
        log.warning("turn %s: the turns ahead of it kept moving; gave up ending them", newer.id)

    async def _stop_running(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> None:
        """Ask a running turn to end as ``status``: directly when it runs here, else through
        the store, where its owner's watcher finds the request."""
        here = self.local.running.get(turn_id)
        if here is not None:
            here.ctx.request_cancel(status, reason)
            return
        await self.store.request_cancel(key, turn_id, status, reason)
        # It may have started here meanwhile, its watcher having read the requests before
        # this one: a watcher that waits for other processes' writes would not look again for
        # ours, so tell the turn directly.
        here = self.local.running.get(turn_id)
        if here is not None:
            here.ctx.request_cancel(status, reason)
        elif key in self.local.leases:
            # Started here and not registered yet (started as it was admitted, say): it reads
            # this as it registers, or is resolved here as it ends.
            self.local.asked[turn_id] = (key, status, reason)

    # -- waiting, cancelling, following ----------------------------------------------------------
    async def wait(self, key: SessionKey, turn_id: str, *, until_input: bool = False) -> Turn:
        """The turn once it has ended (bound it with ``asyncio.timeout``).

        With ``until_input``, also as soon as it waits for a decision (``awaiting_input``), or
        waits in the queue behind a turn that does (:meth:`parked_ahead`): a caller that can
        decide it (or tell someone who can) gets it then, rather than after the deadline.
        """
        waiters = self.local.waiters
        read_store = turn_id not in waiters
        counter = self._counter
        seen: int | None = None
        accepted = self.local.accepted_at.get(turn_id)
        # Accepted here: the admission was the last look at the store.
        news = StoreNews(counter, accepted[1] if accepted is not None else None)
        while True:
            if self.local.closed:
                raise _shutting_down()  # nothing here will end the turn now
            if read_store:
                news.looking()
                turn = await self.store.get_turn(key, turn_id)
                if turn is None:
                    raise TurnNotFound("turn not found")
                if turn.ended:
                    self.local.resolve(turn)  # ended by another process: release local waiters
                    return turn
                if until_input and turn.status == "awaiting_input":
                    return turn
                if until_input and turn.status == "queued" and await self.parked_ahead(turn):
                    return turn  # it waits behind a human too: the caller should know
            local = waiters.get(turn_id)
            if local is None or local[0] != key:
                # Not accepted here (or not under this key): look at the store again when
                # another process rings it, or poll it.
                read_store = True
                await news.wait(None, NOT_HERE_POLL)
                continue
            # Accepted here and not ended. If this process runs it (it holds the session's
            # lease), its end resolves the future at once; if another process holds the
            # session (several workers or nodes on one store), only the store will tell, so
            # look there when rung, or often, cheaply when the store has a change counter.
            here = key in self.local.leases
            fut: asyncio.Future[Turn] = asyncio.get_running_loop().create_future()
            local[1].append(fut)
            if here:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LOCAL_SAFETY):
                        await asyncio.shield(fut)
            else:
                await news.wait(fut, CROSS_PROCESS_POLL if counter else CROSS_PROCESS_READ)
            if fut.done():
                turn = fut.result()
                if turn.ended or until_input:
                    return turn
                continue  # parked: wait on through the decision
            with contextlib.suppress(ValueError):
                local[1].remove(fut)
            accepted = self.local.accepted_at.get(turn_id)
            if (
                not here
                and key in self.local.leases
                and counter is not None
                and accepted is not None
                and counter.seen_version() == accepted[0]
            ):
                # This process's worker took the lease meanwhile (it had not when the turn was
                # submitted), so the turn's end comes here now; and no other process has
                # committed since the turn was accepted (the version the store noted before
                # its latest batch, no I/O), so none ended it first: no read needed.
                read_store = False
                continue
            if counter is not None and not here:
                news.looking()
                version = await counter.data_version()
                if version == seen:
                    read_store = False
                    continue  # nobody else wrote: the turn is as it was
                seen = version
            read_store = True

    async def cancel(self, key: SessionKey, turn_id: str, reason: Reason = "cancelled") -> Turn:
        """Cancel a queued, running or parked turn; an ended turn is returned as it is."""
        while True:
            turn = await self.store.get_turn(key, turn_id)
            if turn is None:
                raise TurnNotFound("turn not found")
            if turn.ended:
                return turn
            if turn.status in ("queued", "awaiting_input"):
                # Nobody runs it (or not yet): it ends here, unless a worker takes it first.
                ended = await self.store.end_waiting_turn(key, turn_id, reason)
                if ended is not None:
                    self.local.resolve(ended)
                    self.workers.kick(key)  # the turns behind a parked one may run now
                    return ended
                continue
            await self._stop_running(key, turn_id, "cancelled", reason)
            done = await self.wait(key, turn_id, until_input=True)
            if done.ended:
                return done
            # It parked on a decision before the request reached it: end it parked.

    # -- decisions -------------------------------------------------------------------------------
    async def parked_ahead(self, turn: Turn) -> Turn | None:
        """The turn awaiting input that ``turn`` (queued) waits behind, if any: nothing of the
        session runs before a human decides it."""
        if turn.status != "queued":
            return None
        active = await self.store.active_turns(turn.key)
        if active and active[0].status == "awaiting_input" and active[0].id != turn.id:
            return active[0]
        return None

    async def decide(
        self,
        key: SessionKey,
        turn_id: str,
        call_id: str,
        verdict: Verdict,
        *,
        answer: str | None = None,
        by: str,
        principal: Principal | None = None,
    ) -> Decision:
        """Decide a pending decision of ``key``'s turn; the turn goes on, on this process
        (or whichever takes the session first). DecisionNotFound for an unknown or foreign one,
        DecisionMade (with the first decision) when it is no longer pending.

        ``principal`` (the session's owner, who decides) is whom the resumed turn's tools and
        memory act for here, as the submitter's are where it started.
        """
        done = await self.store.decide(key, turn_id, call_id, verdict, answer=answer, by=by)
        if principal is not None:
            self.local.principals[key] = principal
        self.workers.kick(key)
        return done

    async def decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
        limit: int = 100,
    ) -> list[Decision]:
        return await self.store.list_decisions(key, turn_id=turn_id, status=status, limit=limit)

    def events(
        self, key: SessionKey, turn_id: str, after_seq: int = 0
    ) -> AsyncGenerator[Event, None]:
        """The turn's events after ``after_seq``: replayed, then followed live until the end."""
        return follow_turn(
            self.store, self.local.feeds, key, turn_id, after_seq, closing=lambda: self.closing
        )

    def running_turns(self) -> list[Turn]:
        return [r.turn for r in self.local.running.values()]


def _shutting_down() -> ShuttingDown:
    return ShuttingDown(
        "the server is shutting down: the turn is not ended, and another server (or this one, "
        "restarted) takes it up"
    )
