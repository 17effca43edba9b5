"""Turns, leases, a turn's fenced writes and cancel requests, for the SQLite store.

What each step means (admission, endings, recovery) is :mod:`tether.store.rules`; here it is
carried out in one ``BEGIN IMMEDIATE`` transaction per call, which holds SQLite's write lock
from the first read: the facts a rule is asked about cannot change before the write commits.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from tether.errors import Conflict, SessionNotFound, StaleLease
from tether.records import (
    ACTIVE_STATUSES,
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
    Usage,
)
from tether.store import rules
from tether.store.rows import (
    cancel_json,
    cancel_of,
    decision_values,
    event_rows,
    events_of,
    item_row,
    key_args,
    turn_row,
    usage_json,
)
from tether.store.rules import DEFAULT_MAX_QUEUE
from tether.store.sqlite import queries as q
from tether.store.sqlite import steps
from tether.store.sqlite.connection import Connection
from tether.store.sqlite.recall_steps import apply_writes
from tether.store.sqlite.steps import session_pk


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
        def do(c: sqlite3.Connection) -> Turn:
            return self._enqueue(
                c, key, turn_id, input, policy, max_queue, agent, limits, idempotency
            ).turn

        return await self._write(do)

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
        def do(c: sqlite3.Connection) -> tuple[Turn, Lease | None]:
            turn, first = self._enqueue(
                c, key, turn_id, input, policy, max_queue, agent, limits, idempotency
            )
            return turn, (_take_lease(c, key, owner, ttl) if first is not None else None)

        return await self._write(do)

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
        def do(c: sqlite3.Connection) -> tuple[Turn, list[Item] | None]:
            session = steps.fenced_session(c, lease)
            turn, first = self._enqueue(
                c,
                lease.key,
                turn_id,
                input,
                policy,
                max_queue,
                agent,
                limits,
                idempotency,
                session=session,
            )
            if first != turn_id:
                return turn, None  # a retry's turn, or one that waits behind another
            pk, now = session[0], time.time()
            c.execute(q.START_TURN, (now, turn_id, pk))
            # Its only event so far is the turn.queued that _enqueue wrote.
            last = rules.QUEUED_EVENT_SEQ
            written = steps.add_rows(c, pk, turn_id, items, events, last_event=last)
            return replace(turn, status="running", started_at=now), written

        return await self._write(do)

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
        def do(c: sqlite3.Connection) -> tuple[Turn, Lease | None, list[Item] | None]:
            if idempotency is None and items:
                started = _start_at_once(
                    c, key, owner, ttl, turn_id, input, policy, items, events, max_queue, agent,
                    limits, expect_agent,
                )  # fmt: skip
                if started is not None:
                    return started
            if expect_agent is not None:
                row = c.execute(q.SESSION_AGENT, key_args(key)).fetchone()
                if row is not None and row[0] != expect_agent:
                    raise rules.agent_changed(expect_agent, row[0])
            turn, first = self._enqueue(
                c, key, turn_id, input, policy, max_queue, agent, limits, idempotency
            )
            lease = _take_lease(c, key, owner, ttl) if first is not None else None
            if lease is None or lease.queue != (turn_id,):
                return turn, lease, None  # held elsewhere, or other turns come first
            pk = steps.session_pk(c, key)
            now = time.time()
            c.execute(q.START_TURN, (now, turn_id, pk))
            # A new turn (a retry's took no lease): its only event is _enqueue's turn.queued.
            last = rules.QUEUED_EVENT_SEQ
            written = steps.add_rows(c, pk, turn_id, items, events, last_event=last)
            return replace(turn, status="running", started_at=now), lease, written

        return await self._write(do)

    @staticmethod
    def _enqueue(
        c: sqlite3.Connection,
        key: SessionKey,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
        idempotency: Idempotency | None,
        *,
        session: tuple[int, float | None] | None = None,
    ) -> _Enqueued:
        """The admission and the new turn; or the turn a retry's key made (``first`` None).
        ``session`` is the session's pk and expiry when the caller read them already."""
        if session is None:
            row = c.execute(q.SESSION_FOR_ENQUEUE, key_args(key)).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            session = (int(row[0]), row[1])
        (pk, expires_at), now = session, time.time()
        if idempotency is not None:
            known = c.execute(q.TURN_BY_IDEMPOTENCY, (pk, idempotency.key)).fetchone()
            if known is not None:
                if rules.replays(known[-1], known[13], idempotency, now):
                    return _Enqueued(turn_row(known), None)
                c.execute(q.RELEASE_IDEMPOTENCY, (pk, idempotency.key))
        active = c.execute(q.ACTIVE_TURN_IDS, (pk,)).fetchall()
        rules.admit(policy, expires_at=expires_at, now=now, active=active, max_queue=max_queue)
        if rules.bounds_turns(limits):
            busy, total = c.execute(q.OWNER_ACTIVE, (key.tenant, key.owner)).fetchone()
            rules.admit_for_principal(
                limits, busy_sessions=busy, active_turns=total, session_active=bool(active)
            )
        (seq,) = c.execute(q.NEXT_TURN_SEQ, (pk,)).fetchone()
        turn = rules.queued_turn(turn_id, key, seq, input, policy, now, agent)
        try:
            c.execute(
                q.INSERT_TURN,
                (
                    turn_id,
                    pk,
                    seq,
                    input,
                    policy,
                    turn.status,
                    now,
                    *rules.agent_args(agent),
                    *rules.idempotency_args(idempotency),
                    key.tenant,
                    key.owner,
                ),
            )
        except sqlite3.IntegrityError as exc:
            raise rules.duplicate_turn(turn_id) from exc
        steps.write_event(c, turn_id, rules.queued_event(turn), now)
        # The new turn is the session's last: the first active one is the oldest read above.
        return _Enqueued(turn, str(active[0][0]) if active else turn_id)

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        def do(c: sqlite3.Connection) -> Turn | None:
            try:
                pk = session_pk(c, key)
            except SessionNotFound:
                return None
            return steps.get_turn(c, pk, turn_id)

        return await self._run(do)

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]:
        def do(c: sqlite3.Connection) -> list[Turn]:
            rows = c.execute(q.LIST_TURNS, (session_pk(c, key), after_seq, limit)).fetchall()
            return [turn_row(r) for r in rows]

        return await self._run(do)

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        def do(c: sqlite3.Connection) -> list[Turn]:
            return [turn_row(r) for r in c.execute(q.ACTIVE_TURNS, (session_pk(c, key),))]

        return await self._run(do)

    async def end_waiting_turn(
        self,
        key: SessionKey,
        turn_id: str,
        reason: Reason,
        *,
        status: CancelStatus = "cancelled",
    ) -> Turn | None:
        return await self._write(
            lambda c: steps.end_waiting(c, session_pk(c, key), key, turn_id, status, reason)
        )

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        def do(c: sqlite3.Connection) -> Lease | None:
            lease = _take_lease(c, key, owner, ttl)
            if lease is None:
                session_pk(c, key)  # SessionNotFound when it is the session that is missing
            return lease

        return await self._write(do)

    async def lease_holder(self, key: SessionKey) -> str | None:
        def do(c: sqlite3.Connection) -> str | None:
            row = c.execute(q.LEASE_HOLDER, key_args(key)).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            return row[0] if row[0] is not None and row[1] > time.time() else None

        return await self._run(do)

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        def do(c: sqlite3.Connection) -> Lease | None:
            now = time.time()
            args = (owner, now + ttl, *key_args(key), from_owner)
            row = c.execute(q.TAKE_OVER_LEASE, args).fetchone()
            return Lease(key, owner, int(row[0]), now + ttl) if row else None

        return await self._write(do)

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        def do(c: sqlite3.Connection) -> list[Lease]:
            now = time.time()
            kept = []
            for lease in leases:
                args = (now + ttl, *key_args(lease.key), lease.token, lease.owner)
                if c.execute(q.RENEW_LEASE, args).rowcount == 1:
                    kept.append(Lease(lease.key, lease.owner, lease.token, now + ttl))
            return kept

        return await self._write(do)

    async def release_lease(self, lease: Lease) -> None:
        def do(c: sqlite3.Connection) -> None:
            c.execute(q.RELEASE_LEASE, (*key_args(lease.key), lease.token))

        await self._write(do)

    # -- fenced writes -------------------------------------------------------------------------
    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = steps.fenced_pk(c, lease)
            first = c.execute(q.FIRST_ACTIVE_TURN, (pk,)).fetchone()
            if first is not None and first[0] != turn_id:
                if c.execute(q.TURN_IS_NEW, (turn_id, pk)).fetchone() is not None:
                    raise rules.not_next(turn_id)
                raise rules.not_in_status(turn_id, "queued")
            if c.execute(q.START_TURN, (time.time(), turn_id, pk)).rowcount != 1:
                raise rules.not_in_status(turn_id, "queued")
            return steps.add_rows(c, pk, turn_id, items, events)

        return await self._write(do)

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = steps.fenced_pk(c, lease)
            # Turn ids are unique across sessions here, so without this check the events of
            # another session's turn could be written under this session's lease.
            if c.execute(q.TURN_IS_RUNNING, (turn_id, pk)).fetchone() is None:
                raise rules.not_in_status(turn_id, "running")
            return steps.add_rows(c, pk, turn_id, items, events)

        return await self._write(do)

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> Turn:
        def do(c: sqlite3.Connection) -> Turn:
            return _end(c, lease, turn_id, ending, items, events, memory)[1]

        return await self._write(do)

    async def end_turn_released(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> tuple[Turn, bool]:
        def do(c: sqlite3.Connection) -> tuple[Turn, bool]:
            return _end_released(c, lease, turn_id, ending, items, events, memory)

        return await self._write(do)

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

        def do(c: sqlite3.Connection) -> Turn:
            pk = steps.fenced_pk(c, lease)
            turn = steps.get_turn(c, pk, turn_id)
            if turn is None or turn.status != "running":
                raise rules.not_in_status(turn_id, "running")
            steps.add_rows(c, pk, turn_id, items, events)
            try:
                c.execute(q.INSERT_DECISION, (pk, *decision_values(stored)))
            except sqlite3.IntegrityError as exc:
                msg = f"turn {turn_id} already has a decision on call {stored.call_id}"
                raise Conflict(msg) from exc
            held = rules.held_memory_json(memory)
            c.execute(q.PARK_TURN, (usage_json(usage), held, turn_id))
            return rules.parked(turn, usage)

        return await self._write(do)

    async def resume_turn(
        self, lease: Lease, turn_id: str, events: Sequence[NewEvent]
    ) -> tuple[list[Item], MemoryWrites | None]:
        def do(c: sqlite3.Connection) -> tuple[list[Item], MemoryWrites | None]:
            pk = steps.fenced_pk(c, lease)
            row = c.execute(q.RESUMABLE, (turn_id, pk)).fetchone()
            if row is None or row[0] != "queued":
                raise rules.not_in_status(turn_id, "queued")
            if row[1] is None:  # never started: start_turn's, not a decided turn going on
                raise rules.not_in_status(turn_id, "awaiting_input")
            steps.add_rows(c, pk, turn_id, [], events)
            c.execute(q.RESUME_TURN, (turn_id,))
            items = [item_row(r) for r in c.execute(q.TURN_ITEMS, (pk, turn_id))]
            return items, rules.held_memory(row[2])

        return await self._write(do)

    async def set_state(self, lease: Lease, name: str, value: Any) -> None:
        def do(c: sqlite3.Connection) -> None:
            pk = steps.fenced_pk(c, lease)
            (state,) = c.execute(q.SESSION_STATE, (pk,)).fetchone()
            changed = rules.with_state(json.loads(state), name, value)
            c.execute(q.SET_SESSION_STATE, (json.dumps(changed), time.time(), pk))

        await self._write(do)

    async def recover(self, lease: Lease) -> list[Turn]:
        def nothing_to_do(c: sqlite3.Connection) -> bool:
            # Only a lease holder starts turns, so while we hold the lease no turn can start
            # running behind this read: "nothing running" stays true without a write lock.
            return c.execute(q.ANY_RUNNING, (steps.fenced_pk(c, lease),)).fetchone() is None

        if await self._run(nothing_to_do):
            return []
        return await self._write(lambda c: steps.recover(c, steps.fenced_pk(c, lease)))

    # -- cancel requests and events --------------------------------------------------------------
    async def request_cancel(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            try:
                pk = session_pk(c, key)
            except SessionNotFound:
                return False
            args = (cancel_json(status, reason), turn_id, pk)
            return c.execute(q.REQUEST_CANCEL, args).rowcount == 1

        return await self._write(do)

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        ids = json.dumps(list(turn_ids))

        def do(c: sqlite3.Connection) -> dict[str, tuple[CancelStatus, Reason]]:
            return {tid: cancel_of(raw) for tid, raw in c.execute(q.CANCEL_REQUESTS, (ids,))}

        return await self._run(do) if turn_ids else {}

    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        def do(c: sqlite3.Connection) -> list[Event]:
            try:
                pk = session_pk(c, key)
            except SessionNotFound:
                return []
            rows = c.execute(q.LIST_EVENTS, (turn_id, pk, after_seq, limit)).fetchall()
            return events_of(turn_id, rows, after_seq, limit)

        return await self._run(do)


class _Enqueued(NamedTuple):
    turn: Turn
    first: str | None
    """The session's first active turn once this one was admitted (this one's id when nothing
    was ahead of it); None for the turn a retry's idempotency key made before."""


def _start_at_once(
    c: sqlite3.Connection,
    key: SessionKey,
    owner: str,
    ttl: float,
    turn_id: str,
    input: str,
    policy: Policy,
    items: Sequence[NewItem],
    events: Sequence[NewEvent],
    max_queue: int,
    agent: AgentRef | None,
    limits: PrincipalLimits | None,
    expect_agent: str | None,
) -> tuple[Turn, Lease, list[Item]] | None:
    """``enqueue_turn_taken``'s common case in one pass: a turn on an idle session (its lease
    free or expired, no turn of it active) admitted, leased and started with one update of the
    session's row, where the admission, the lease and the start made three and wrote the turn
    twice (13 statements, 6 now: on this thread each is a hand-back of the GIL). What it writes
    and answers is what they did, and it refuses as they would (a refusal after a write undoes
    the call, as it did theirs); None, having written nothing, for any other case (a missing
    session, a lease held, a turn ahead), which the caller's own way answers."""
    now = time.time()
    row = c.execute(q.SESSION_FOR_START, key_args(key)).fetchone()
    if row is None:
        return None
    pk, expires_at, holder, held_until, session_agent, turn_ahead = row
    if expect_agent is not None and session_agent != expect_agent:
        raise rules.agent_changed(expect_agent, session_agent)
    if (holder is not None and held_until > now) or turn_ahead:
        return None
    rules.admit(policy, expires_at=expires_at, now=now, active=[], max_queue=max_queue)
    if rules.bounds_turns(limits):
        busy, total = c.execute(q.OWNER_ACTIVE, (key.tenant, key.owner)).fetchone()
        rules.admit_for_principal(
            limits, busy_sessions=busy, active_turns=total, session_active=False
        )
    until = now + ttl
    seq, token, first = c.execute(
        q.START_AT_ONCE, (owner, until, len(items), now, pk, len(items))
    ).fetchone()
    turn = replace(
        rules.queued_turn(turn_id, key, seq, input, policy, now, agent),
        status="running",
        started_at=now,
    )
    try:
        c.execute(
            q.INSERT_STARTED_TURN,
            (turn_id, pk, seq, input, policy, now, now, *rules.agent_args(agent),
             key.tenant, key.owner),
        )  # fmt: skip
    except sqlite3.IntegrityError as exc:
        raise rules.duplicate_turn(turn_id) from exc
    # After the turn, as add_rows checked them (a taken id is the error when both are wrong);
    # a refusal here undoes the call's writes, as it undid the three steps'.
    rules.check_event_seqs(turn_id, rules.QUEUED_EVENT_SEQ, [e.seq for e in events])
    queued = rules.queued_event(turn)
    rows = [(queued.seq, None, queued.type, json.dumps(queued.data)), *event_rows(events)]
    c.executemany(q.INSERT_EVENT, [(turn_id, *r, now) for r in rows])
    written = rules.stored_items(turn_id, first, items, now)
    c.executemany(q.INSERT_ITEM, [steps.item_values(pk, i, now) for i in written])
    lease = Lease(key, owner, token, until, left_running=False, queue=(turn_id,), history_seq=first)
    return turn, lease, written


def _end_released(
    c: sqlite3.Connection,
    lease: Lease,
    turn_id: str,
    ending: TurnEnding,
    items: Sequence[NewItem],
    events: Sequence[NewEvent],
    memory: MemoryWrites | None,
) -> tuple[Turn, bool]:
    """``_end``, then the lease given up when no other turn of the session is active: the
    ended turn and whether it was. Three statements fewer than one after the other (9 to 6):
    the fence, the turn and its last event seq are one read, and the update that numbers the
    items lets the lease go. Whether it goes is asked before the ending's writes, of the turns
    but this one and of the status it ends in, where it was asked of them all after; under the
    write lock nothing else changes between the two."""
    row = c.execute(q.FENCE_AND_TURN, (turn_id, *key_args(lease.key))).fetchone()
    if row is None:
        raise SessionNotFound("session not found")
    pk, token = int(row[0]), row[1]
    if token != lease.token:
        raise StaleLease(rules.stale_message(lease.token, token))
    turn = turn_row(row[2:-1]) if row[2] is not None else None
    if turn is None or turn.status != "running":
        raise rules.not_in_status(turn_id, "running")
    # Checked before the first write, as add_rows does, against the last seq the read found.
    rules.check_event_seqs(turn_id, int(row[-1]), [e.seq for e in events])
    release = ending.status not in ACTIVE_STATUSES and (
        c.execute(q.OTHER_ACTIVE_TURN, (pk, turn_id)).fetchone() is None
    )
    now = time.time()
    if items:
        (first,) = c.execute(
            q.NUMBER_ITEMS_RELEASING, (len(items), now, release, release, pk, len(items))
        ).fetchone()
        written = rules.stored_items(turn_id, first, items, now)
        c.executemany(q.INSERT_ITEM, [steps.item_values(pk, i, now) for i in written])
    elif release:
        c.execute(q.RELEASE_LEASE, (*key_args(lease.key), lease.token))
    if events:
        steps.insert_events(c, turn_id, events, now)
    done = steps.finish(c, pk, turn, ending, terminal=False)
    if memory and rules.keeps_memory(ending.status):
        apply_writes(c, memory)
    return done, release


def _take_lease(c: sqlite3.Connection, key: SessionKey, owner: str, ttl: float) -> Lease | None:
    """The session's lease for ``owner`` if it is free or expired (None otherwise), with what
    the store sees of the session as it grants it."""
    now = time.time()
    row = c.execute(q.ACQUIRE_LEASE, (owner, now + ttl, *key_args(key), now)).fetchone()
    if row is None:
        return None
    # Under the write lock, the token just moved: no turn can be queued or start behind this
    # look.
    active = c.execute(q.ACTIVE_TURN_IDS, (int(row[1]),)).fetchall()
    return Lease(
        key,
        owner,
        int(row[0]),
        now + ttl,
        left_running=any(status == "running" for _, status in active),
        queue=tuple(turn_id for turn_id, _ in active),
        history_seq=int(row[2]),
    )


def _end(
    c: sqlite3.Connection,
    lease: Lease,
    turn_id: str,
    ending: TurnEnding,
    items: Sequence[NewItem],
    events: Sequence[NewEvent],
    memory: MemoryWrites | None,
) -> tuple[int, Turn]:
    """End the running ``turn_id`` under ``lease``: its session's pk and the ended turn."""
    pk = steps.fenced_pk(c, lease)
    turn = steps.get_turn(c, pk, turn_id)
    if turn is None or turn.status != "running":
        raise rules.not_in_status(turn_id, "running")
    steps.add_rows(c, pk, turn_id, items, events)
    done = steps.finish(c, pk, turn, ending, terminal=False)
    if memory and rules.keeps_memory(ending.status):
        apply_writes(c, memory)
    return pk, done
