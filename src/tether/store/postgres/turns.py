"""Turns, leases, a turn's fenced writes and cancel requests, for the PostgreSQL store.

What each step means (admission, endings, recovery) is :mod:`tether.store.rules`; here every
write that depends on a session's state first takes that session's row lock, in the same
transaction, so the facts a rule was asked about hold until the write commits — across any
number of processes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from tether import events
from tether.errors import Conflict, SessionNotFound, StaleLease, StoreError
from tether.records import (
    AgentRef,
    CancelStatus,
    Decision,
    Event,
    Idempotency,
    Item,
    Lease,
    MemoryWrites,
    NewEvent,
    NewItem,
    Policy,
    PrincipalLimits,
    Reason,
    SessionKey,
    Turn,
    TurnEnding,
    TurnStatus,
    Usage,
)
from tether.store import rules
from tether.store.postgres import queries as q
from tether.store.postgres import steps
from tether.store.postgres.connection import Connection
from tether.store.postgres.recall_steps import apply_writes
from tether.store.postgres.steps import lock_session
from tether.store.rows import (
    cancel_json,
    cancel_of,
    decision_row,
    decision_values,
    event_rows,
    events_of,
    item_row,
    key_args,
    turn_row,
    usage_json,
)
from tether.store.rules import DEFAULT_MAX_QUEUE


class Turns(Connection):
    # -- turns ---------------------------------------------------------------------------------
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
        kept = (turn_id, input, policy, max_queue, agent, limits, idempotency)
        return (await self._admit(key, *kept, by=by, ttl=None))[0]

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
        kept = (turn_id, input, policy, max_queue, agent, limits, idempotency)
        return await self._admit(key, *kept, by=owner, ttl=ttl)

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
        key = lease.key
        rules.check_event_seqs(turn_id, rules.QUEUED_EVENT_SEQ, [e.seq for e in events])
        now = time.time()
        args = self._admission_args(
            key, turn_id, input, policy, now, max_queue, agent, limits, idempotency, lease.owner
        )
        written = _rows_args(items, events)
        row = await self._admission(turn_id, q.ENQUEUE_STARTED, *args, lease.token, *written)
        if row[0] == "stale":
            raise StaleLease(rules.stale_message(lease.token, int(row[7])))
        if row[0] == "started":
            turn = rules.queued_turn(turn_id, key, int(row[1]), input, policy, now, agent)
            stored = rules.stored_items(turn_id, int(row[8]), items, now) if items else []
            return replace(turn, status="running", started_at=now), stored
        admitted = self._admitted(row, key, turn_id, input, policy, now, max_queue, agent, limits)
        if admitted is None:
            admitted = await self._enqueue_known(
                key,
                turn_id=turn_id,
                input=input,
                policy=policy,
                max_queue=max_queue,
                agent=agent,
                limits=limits,
                idempotency=idempotency,
                by=lease.owner,
            )
        return admitted, None

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
        rules.check_event_seqs(turn_id, rules.QUEUED_EVENT_SEQ, [e.seq for e in events])
        now = time.time()
        args = self._admission_args(
            key, turn_id, input, policy, now, max_queue, agent, limits, idempotency, owner
        )
        taken = (now + ttl, *_rows_args(items, events), expect_agent)
        row = await self._admission(turn_id, q.ENQUEUE_TAKEN, *args, *taken)
        if row[0] == "agent":
            assert expect_agent is not None
            raise rules.agent_changed(expect_agent, str(row[10]))
        if row[0] == "started":
            lease = _taken(row, key, owner, now + ttl, turn_id)
            assert lease is not None  # started only under the lease it took
            turn = rules.queued_turn(turn_id, key, int(row[1]), input, policy, now, agent)
            stored = rules.stored_items(turn_id, int(row[9]), items, now) if items else []
            return replace(turn, status="running", started_at=now), lease, stored
        admitted = self._admitted(row, key, turn_id, input, policy, now, max_queue, agent, limits)
        if admitted is not None:
            return admitted, _taken(row, key, owner, now + ttl, turn_id), None
        known = await self._enqueue_known(
            key,
            turn_id=turn_id,
            input=input,
            policy=policy,
            max_queue=max_queue,
            agent=agent,
            limits=limits,
            idempotency=idempotency,
            by=owner,
            expect_agent=expect_agent,
        )
        return known, None, None

    async def _admission(self, turn_id: str, query: str, *args: Any) -> Any:
        """The row of one of the admission functions (tether_enqueue and those that call it);
        a turn id already taken is the rule's duplicate."""
        async with self._conn() as conn:
            try:
                row = await conn.fetchrow(query, *args)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name == "turns_pkey":
                    raise rules.duplicate_turn(turn_id) from None
                raise
        assert row is not None  # a function with OUT parameters answers one row
        return row

    @staticmethod
    def _admission_args(
        key: SessionKey,
        turn_id: str,
        input: str,
        policy: Policy,
        now: float,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
        idempotency: Idempotency | None,
        by: str | None,
    ) -> tuple[Any, ...]:
        """tether_enqueue's arguments (migration 14's overload)."""
        return (
            *key_args(key),
            turn_id,
            input,
            policy,
            now,
            *rules.agent_args(agent),
            *rules.idempotency_args(idempotency),
            max_queue,
            rules.bounds_turns(limits),
            limits.running_turns if limits is not None else None,
            limits.queued_turns if limits is not None else None,
            rules.QUEUED_EVENT_SEQ,
            events.TURN_QUEUED,
            by,
        )

    async def _admit(
        self,
        key: SessionKey,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
        idempotency: Idempotency | None,
        *,
        by: str | None,
        ttl: float | None,
    ) -> tuple[Turn, Lease | None]:
        """The admission; with ``ttl``, the session's lease for ``by`` too when it is free."""
        # One statement that commits as it returns (see migration 9's tether_enqueue): the
        # session's row lock and the owner's are never held across a round trip to this
        # process, whose event loop may be slow to come back when it is busy.
        now = time.time()
        args = self._admission_args(
            key, turn_id, input, policy, now, max_queue, agent, limits, idempotency, by
        )
        if ttl is None:
            row = await self._admission(turn_id, q.ENQUEUE, *args)
        else:
            row = await self._admission(turn_id, q.ENQUEUE_LEASED, *args, now + ttl)
        admitted = self._admitted(row, key, turn_id, input, policy, now, max_queue, agent, limits)
        if admitted is not None:
            if ttl is None:
                return admitted, None
            assert by is not None
            return admitted, _taken(row, key, by, now + ttl, turn_id)
        # 'known': the key names a turn already; whether it is answered with it, refused or
        # (its window over) released is decided in a transaction of its own (no lease taken).
        known = await self._enqueue_known(
            key,
            turn_id=turn_id,
            input=input,
            policy=policy,
            max_queue=max_queue,
            agent=agent,
            limits=limits,
            idempotency=idempotency,
            by=by,
        )
        return known, None

    @staticmethod
    def _admitted(
        row: Any,
        key: SessionKey,
        turn_id: str,
        input: str,
        policy: Policy,
        now: float,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
    ) -> Turn | None:
        """The turn tether_enqueue's answer ``row`` queued; the rule's error when it refused
        it; None when the idempotency key names a turn already ('known')."""
        outcome, seq, expires_at, ids, statuses, busy, total = tuple(row)[:7]
        if outcome == "missing":
            raise SessionNotFound("session not found")
        if outcome == "queued":
            return rules.queued_turn(turn_id, key, int(seq), input, policy, now, agent)
        if outcome == "refused":
            active = list(zip(ids, statuses, strict=True))
            rules.admit(policy, expires_at=expires_at, now=now, active=active, max_queue=max_queue)
            rules.admit_for_principal(
                limits,
                busy_sessions=int(busy or 0),
                active_turns=int(total or 0),
                session_active=bool(active),
            )
            raise StoreError("tether_enqueue refused a turn the admission rules admit")
        return None

    async def _enqueue_known(
        self,
        key: SessionKey,
        *,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
        idempotency: Idempotency | None,
        by: str | None,
        expect_agent: str | None = None,
    ) -> Turn:
        async with self._tx() as conn:
            # The session row lock makes the busy and queue-bound checks hold until commit.
            pk, _, expires_at = await lock_session(conn, key)
            if expect_agent is not None:
                # As tether_enqueue_taken checked it: the session may be another one by now.
                found = await conn.fetchval(q.SESSION_AGENT, pk)
                if found != expect_agent:
                    raise rules.agent_changed(expect_agent, str(found))
            now = time.time()
            if idempotency is not None:
                known = await conn.fetchrow(q.TURN_BY_IDEMPOTENCY, pk, idempotency.key)
                if known is not None:
                    if rules.replays(known[-1], known[13], idempotency, now):
                        return turn_row(tuple(known))
                    await conn.execute(q.RELEASE_IDEMPOTENCY, pk, idempotency.key)
            active = [(r[0], r[1]) for r in await conn.fetch(q.ACTIVE_TURN_IDS, pk)]
            rules.admit(policy, expires_at=expires_at, now=now, active=active, max_queue=max_queue)
            seq = int(await conn.fetchval(q.NEXT_TURN_SEQ, pk))
            turn = rules.queued_turn(turn_id, key, seq, input, policy, now, agent)
            inserted = await conn.fetchval(
                q.INSERT_TURN,
                turn_id,
                pk,
                seq,
                input,
                policy,
                now,
                *rules.agent_args(agent),
                *rules.idempotency_args(idempotency),
            )
            if inserted is None:
                raise rules.duplicate_turn(turn_id)  # rolls the seq back too
            await steps.write_event(conn, turn_id, rules.queued_event(turn), now)
            # As tether_enqueue does: delivered on commit, so never for a refused admission.
            await steps.notify_holder(conn, key, now, unless=by)
            if rules.bounds_turns(limits):
                # Last, so the owner's lock (held to commit, and every admission of the owner
                # in any process waits for it) is held for one round trip and the commit. The
                # counts include this turn (and so this session); a refusal rolls it back.
                counts = await conn.fetchrow(q.LOCK_OWNER_ACTIVE, key.tenant, key.owner)
                assert counts is not None  # an aggregate always answers one row
                was_busy = any(status in ("queued", "running") for _, status in active)
                rules.admit_for_principal(
                    limits,
                    busy_sessions=int(counts[0]) - (0 if was_busy else 1),
                    active_turns=int(counts[1]) - 1,
                    session_active=bool(active),
                )
        return turn

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        row = await self._fetchrow(q.GET_TURN_BY_KEY, *key_args(key), turn_id)
        return turn_row(row) if row is not None else None

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]:
        rows = await self._rows_of(key, q.LIST_TURNS, after_seq, max(limit, 0))
        return [turn_row(r) for r in rows]

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        rows = await self._fetch(q.ACTIVE_TURNS_BY_KEY, *key_args(key))
        if not rows:
            raise SessionNotFound("session not found")
        return [turn_row(r) for r in rows if r[0] is not None]

    async def end_waiting_turn(
        self,
        key: SessionKey,
        turn_id: str,
        reason: Reason,
        *,
        status: CancelStatus = "cancelled",
    ) -> Turn | None:
        async with self._tx() as conn:
            # Locked like a fenced write, so the turn cannot start, resume or be decided between
            # the check and the end.
            pk = int((await lock_session(conn, key))[0])
            row = await conn.fetchrow(q.WAITING_TURN, pk, turn_id)
            if row is None:
                return None
            now = time.time()
            ending = rules.waiting_ending(status, reason, turn_row(tuple(row)))
            dropped = await conn.fetch(q.DROP_OF_TURN, turn_id, now)
            for d in sorted((decision_row(key, r) for r in dropped), key=lambda d: d.created_at):
                await steps.decision_made(conn, d, now)
            orphans = await conn.fetch(q.ORPHAN_CALLS, pk, turn_id)
            aborted = rules.aborted_results((call_id, tool) for call_id, tool in orphans)
            await steps.add(conn, pk, turn_id, aborted, [])
            done = await steps.finish(conn, pk, turn_row(tuple(row)), ending, terminal=True)
            await conn.execute(q.SKIP_ITEM_SEQS, pk, rules.ITEM_SEQ_GAP)
            held = rules.held_memory(row[-1])
            if held and rules.keeps_memory(status):
                await apply_writes(conn, held)
            # A turn behind this one may be free to run now: its session's holder hears of it
            # (it trusts the feed while it lingers; the caller may be a CLI that kicks nobody).
            await steps.notify_holder(conn, key, now)
            return done

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        now = time.time()
        async with self._conn() as conn:
            # Conditional on the lease being free or expired: of racing acquirers, the first to
            # update the row wins; the others re-check it after that commit and match nothing.
            row = await conn.fetchrow(q.ACQUIRE, *key_args(key), owner, now + ttl, now)
            if row is None:
                await self._pk(conn, key)  # SessionNotFound when it is the session that is missing
                return None
        token, next_item, running, queue = row
        return Lease(
            key,
            owner,
            int(token),
            now + ttl,
            left_running=bool(running),
            queue=tuple(queue),
            history_seq=int(next_item),
        )

    async def lease_holder(self, key: SessionKey) -> str | None:
        row = await self._fetchrow(q.LEASE_HOLDER, *key_args(key))
        if row is None:
            raise SessionNotFound("session not found")
        holder: str | None = row[0]
        return holder if holder is not None and row[1] > time.time() else None

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        now = time.time()
        async with self._conn() as conn:
            token = await conn.fetchval(
                q.TAKE_OVER_LEASE, *key_args(key), owner, now + ttl, from_owner
            )
            if token is None:
                await self._pk(conn, key)  # as the in-memory store: SessionNotFound when missing
                return None
        return Lease(key, owner, int(token), now + ttl)

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        if not leases:
            return []
        now = time.time()
        rows = await self._fetch(
            q.RENEW_LEASES,
            now + ttl,
            [lease.key.tenant for lease in leases],
            [lease.key.owner for lease in leases],
            [lease.key.session_id for lease in leases],
            [lease.token for lease in leases],
            [lease.owner for lease in leases],
        )
        renewed = {(SessionKey(r[0], r[1], r[2]), int(r[3])) for r in rows}
        return [
            Lease(lease.key, lease.owner, lease.token, now + ttl)
            for lease in leases
            if (lease.key, lease.token) in renewed
        ]

    async def release_lease(self, lease: Lease) -> None:
        await self._execute(q.RELEASE_LEASE, *key_args(lease.key), lease.token)

    # -- fenced writes -------------------------------------------------------------------------
    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        return await self._write(lease, turn_id, items, events, start=True)

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        return await self._write(lease, turn_id, items, events, start=False)

    async def _write(
        self,
        lease: Lease,
        turn_id: str,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        *,
        start: bool,
    ) -> list[Item]:
        """A turn's start or a later write of it, in one statement (migration 10's
        tether_write): fenced by the lease's token; the turn queued (``start``) or running, in
        this session (turn ids are unique across sessions: without the session in the check,
        another session's turn could be written under this lease); events past those written.
        """
        rules.check_event_seqs(turn_id, 0, [e.seq for e in events])  # none repeats
        now = time.time()
        fenced = _write_args(lease, turn_id, now, items, events)
        args = (*fenced[:5], start, *fenced[5:])  # p_start comes after the turn's id
        async with self._conn() as conn:
            try:
                row = await conn.fetchrow(q.WRITE, *args)
            except asyncpg.UniqueViolationError as exc:
                raise Conflict(f"an event seq of turn {turn_id} was already written") from exc
        assert row is not None  # a function with OUT parameters answers one row
        _refused(row, lease, turn_id, events, "queued" if start else "running")
        return rules.stored_items(turn_id, int(row[2]), items, now) if items else []

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> Turn:
        if not (memory and rules.keeps_memory(ending.status)):
            return (await self._end(lease, turn_id, ending, items, events))[0]
        return (await self._end_remembering(lease, turn_id, ending, items, events, memory))[0]

    async def end_turn_released(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> tuple[Turn, bool]:
        if not (memory and rules.keeps_memory(ending.status)):
            return await self._end(lease, turn_id, ending, items, events, release=True)
        return await self._end_remembering(
            lease, turn_id, ending, items, events, memory, release=True
        )

    async def _end_remembering(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites,
        *,
        release: bool = False,
    ) -> tuple[Turn, bool]:
        """Memory writes go with the ending, in one transaction (rare: a turn that
        remembered); with ``release``, the lease too when no other turn is active."""
        async with self._tx() as conn:
            pk = await steps.fenced_pk(conn, lease)
            row = await conn.fetchrow(q.GET_TURN, pk, turn_id)
            if row is None or row[7] != "running":
                raise rules.not_in_status(turn_id, "running")
            await steps.add(conn, pk, turn_id, items, events)
            done = await steps.finish(conn, pk, turn_row(row), ending, terminal=False)
            await apply_writes(conn, memory)
            if not release or await conn.fetchval(q.FIRST_ACTIVE_TURN, pk) is not None:
                return done, False
            await conn.execute(q.RELEASE_LEASE, *key_args(lease.key), lease.token)
            return done, True

    async def _end(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        *,
        release: bool = False,
    ) -> tuple[Turn, bool]:
        """end_turn in one statement (migration 11's tether_end, or with ``release`` 23's
        tether_end_release), with _write's checks; and whether the lease was given up."""
        rules.check_event_seqs(turn_id, 0, [e.seq for e in events])  # none repeats
        now = time.time()
        args = (
            *_write_args(lease, turn_id, now, items, events),
            rules.items_effect(ending.status),
            ending.status,
            ending.reason,
            ending.error,
            ending.output,
            ending.complete,
            usage_json(ending.usage),
            ending.agent,
        )
        async with self._conn() as conn:
            try:
                row = await conn.fetchrow(q.END_RELEASE if release else q.END, *args)
            except asyncpg.UniqueViolationError as exc:
                raise Conflict(f"an event seq of turn {turn_id} was already written") from exc
        assert row is not None  # a function with OUT parameters answers one row
        _refused(row, lease, turn_id, events, "running")
        seq, given, policy, created, started, agent, fingerprint = tuple(row)[4:11]
        running = Turn(
            id=turn_id,
            key=lease.key,
            seq=seq,
            input=given,
            policy=policy,
            status="running",
            reason=None,
            error=None,
            output=None,
            complete=False,
            usage=Usage(),
            created_at=created,
            started_at=started,
            ended_at=None,
            agent=AgentRef(agent, fingerprint or "") if agent is not None else None,
        )
        return rules.ended(running, ending, now), bool(release and row[11])

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
        stored = replace(decision, key=lease.key, turn_id=turn_id)
        async with self._tx() as conn:
            pk = await steps.fenced_pk(conn, lease)
            held = rules.held_memory_json(memory)
            # Conditional on running; the rest rolls back with it when a later step refuses.
            row = await conn.fetchrow(q.PARK_TURN, pk, turn_id, usage_json(usage), held)
            if row is None:
                raise rules.not_in_status(turn_id, "running")
            await steps.add(conn, pk, turn_id, items, events)
            if await conn.fetchval(q.INSERT_DECISION, pk, *decision_values(stored)) is None:
                raise Conflict(f"turn {turn_id} already has a decision on call {stored.call_id}")
            return turn_row(tuple(row))

    async def resume_turn(
        self, lease: Lease, turn_id: str, events: Sequence[NewEvent]
    ) -> tuple[list[Item], MemoryWrites | None]:
        async with self._tx() as conn:
            pk = await steps.fenced_pk(conn, lease)
            row = await conn.fetchrow(q.RESUME_TURN, pk, turn_id)
            if row is None:  # not decided, or never started (start_turn's, not ours)
                raise rules.not_in_status(turn_id, "queued")
            await steps.add(conn, pk, turn_id, [], events)
            items = [item_row(r) for r in await conn.fetch(q.TURN_ITEMS, pk, turn_id)]
            return items, rules.held_memory(row[0])

    async def set_state(self, lease: Lease, name: str, value: Any) -> None:
        async with self._tx() as conn:
            pk = await steps.fenced_pk(conn, lease)
            # The row is locked by the fence: the state read here is the one replaced.
            row = await conn.fetchrow(q.LOCK_SESSION_STATE, *key_args(lease.key))
            assert row is not None  # the fence found it, and holds its lock
            changed = rules.with_state(json.loads(row[1]), name, value)
            await conn.execute(q.SET_SESSION_STATE, pk, json.dumps(changed), time.time())

    async def recover(self, lease: Lease) -> list[Turn]:
        # Most often nothing is running: one read says so (it was a transaction that locked
        # the session's row, four round trips and a flush of the WAL, on every new lease).
        # Only a lease holder starts turns, so while this lease is held none can start
        # running behind the read.
        row = await self._fetchrow(q.RUNNING_UNDER_LEASE, *key_args(lease.key))
        if row is None:
            raise SessionNotFound("session not found")
        token, running = row
        if token != lease.token:
            raise StaleLease(rules.stale_message(lease.token, token))
        if not running:
            return []
        async with self._tx() as conn:
            return await steps.recover(conn, await steps.fenced_pk(conn, lease))

    # -- cancel requests and events --------------------------------------------------------------
    async def request_cancel(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> bool:
        request = cancel_json(status, reason)
        async with self._tx() as conn:
            done = await conn.fetchval(q.REQUEST_CANCEL, *key_args(key), turn_id, request)
            if done is not None:
                # Delivered on commit, so the listener never reads a request not yet visible.
                await conn.execute(q.NOTIFY_CANCEL, q.CANCEL_CHANNEL, turn_id)
        return done is not None

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        if not turn_ids:
            return {}
        rows = await self._fetch(q.CANCEL_REQUESTS, list(turn_ids))
        return {turn_id: cancel_of(raw) for turn_id, raw in rows}

    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        limit = max(limit, 0)
        rows = await self._fetch(q.LIST_EVENTS, *key_args(key), turn_id, after_seq, limit)
        return events_of(turn_id, rows, after_seq, limit)


def _write_args(
    lease: Lease, turn_id: str, now: float, items: Sequence[NewItem], events: Sequence[NewEvent]
) -> tuple[Any, ...]:
    """tether_write's and tether_end's leading arguments (but tether_write's p_start): the
    fence, the turn, the time, then the items and the events one array per column."""
    return (*key_args(lease.key), lease.token, turn_id, now, *_rows_args(items, events))


def _taken(row: Any, key: SessionKey, by: str, until: float, turn_id: str) -> Lease | None:
    """The lease tether_enqueue took for ``by`` as it queued ``turn_id`` (None: not taken)."""
    if row[7] is None:
        return None
    # Taken under the session's row lock, after the look at its turns: exact.
    statuses, ids = row[4], row[3]
    return Lease(
        key,
        by,
        int(row[7]),
        until,
        left_running="running" in statuses,
        queue=(*ids, turn_id),
        history_seq=int(row[8]),
    )


def _rows_args(items: Sequence[NewItem], events: Sequence[NewEvent]) -> tuple[Any, ...]:
    """The items and the events of tether_write's arguments, one array per column."""
    rows = event_rows(events)
    return (
        [i.kind for i in items],
        [i.content for i in items],
        [i.complete for i in items],
        [i.call_id for i in items],
        [i.tool_name for i in items],
        [i.arguments for i in items],
        [json.dumps(i.meta) for i in items],
        [r[0] for r in rows],
        [r[1] for r in rows],
        [r[2] for r in rows],
        [r[3] for r in rows],
    )


def _refused(
    row: Any, lease: Lease, turn_id: str, events: Sequence[NewEvent], status: TurnStatus
) -> None:
    """Raise the rule's error for a refusal of tether_write or tether_end (row: outcome,
    current_token, first_seq, last_event, ...)."""
    outcome, current, _, last = tuple(row)[:4]
    if outcome == "missing":
        raise SessionNotFound("session not found")
    if outcome == "stale":
        raise StaleLease(rules.stale_message(lease.token, int(current)))
    if outcome == "status":
        raise rules.not_in_status(turn_id, status)
    if outcome == "not_next":
        raise rules.not_next(turn_id)
    if outcome == "events":
        rules.check_event_seqs(turn_id, int(last), [e.seq for e in events])
        raise StoreError(f"the store refused events the rules accept ({outcome})")
