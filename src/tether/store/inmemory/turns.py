"""Turns, leases, a turn's fenced writes and cancel requests, for the in-memory store.

What each step means (admission, endings, recovery) is :mod:`tether.store.rules`; here it is
only carried out on dicts, in one call that never awaits (see :mod:`.state`).
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tether.errors import Conflict, DecisionNotFound
from tether.records import (
    AgentRef,
    CancelStatus,
    Decision,
    DecisionStatus,
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
    Verdict,
)
from tether.store import rules
from tether.store.inmemory.state import SessionState, State
from tether.store.rules import DEFAULT_MAX_QUEUE


class Turns(State):
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
        return self._enqueue(key, turn_id, input, policy, max_queue, agent, limits, idempotency)[0]

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
        turn, new = self._enqueue(
            key, turn_id, input, policy, max_queue, agent, limits, idempotency
        )
        return turn, self._lease_if_free(key, owner, ttl) if new else None

    def _lease_if_free(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        s, now = self._get(key), time.time()
        if s.lease_owner is not None and s.lease_expires_at > now:
            return None
        return self._grant(s, key, owner, now + ttl)

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
        s = self._fenced(lease)
        # Checked before the first change, as a rolled back transaction would leave nothing:
        # the turn's own events start with turn.queued, seq 1.
        rules.check_event_seqs(turn_id, 1, [e.seq for e in events])
        turn, new = self._enqueue(
            lease.key, turn_id, input, policy, max_queue, agent, limits, idempotency
        )
        if not new or s.first_active() != turn_id:
            return turn, None  # a retry's turn, or one that waits behind another
        now = time.time()
        s.turns[turn_id] = started = replace(turn, status="running", started_at=now)
        out = self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        return started, out

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
        s = self._get(key)
        if expect_agent is not None and s.record.agent != expect_agent:
            raise rules.agent_changed(expect_agent, s.record.agent)
        # Checked before the first change, as a rolled back transaction would leave nothing.
        rules.check_event_seqs(turn_id, 1, [e.seq for e in events])
        turn, new = self._enqueue(
            key, turn_id, input, policy, max_queue, agent, limits, idempotency
        )
        lease = self._lease_if_free(key, owner, ttl) if new else None
        if lease is None or lease.queue != (turn_id,):
            return turn, lease, None  # held elsewhere, or other turns come first
        now = time.time()
        s.turns[turn_id] = started = replace(turn, status="running", started_at=now)
        out = self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        return started, lease, out

    def _enqueue(
        self,
        key: SessionKey,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int,
        agent: AgentRef | None,
        limits: PrincipalLimits | None,
        idempotency: Idempotency | None,
    ) -> tuple[Turn, bool]:
        """The admission and the new turn; or (False) the turn a retry's key made."""
        s = self._get(key)
        now = time.time()
        if idempotency is not None and idempotency.key in s.idempotency:
            known_id, digest = s.idempotency[idempotency.key]
            known = s.turns.get(known_id)
            if known is not None and rules.replays(digest, known.created_at, idempotency, now):
                return known, False
            del s.idempotency[idempotency.key]
        rules.admit(
            policy,
            expires_at=s.record.expires_at,
            now=now,
            active=[(t, s.turns[t].status) for t in s.active],
            max_queue=max_queue,
        )
        if rules.bounds_turns(limits):
            mine = [
                o
                for k, o in self._sessions.items()
                if (k.tenant, k.owner) == (key.tenant, key.owner)
            ]
            # A parked turn holds no worker: it counts against nobody's running turns.
            rules.admit_for_principal(
                limits,
                busy_sessions=sum(1 for o in mine if o.under_way()),
                active_turns=sum(len(o.under_way()) for o in mine),
                session_active=bool(s.active),
            )
        if turn_id in s.turns:
            raise rules.duplicate_turn(turn_id)
        turn = rules.queued_turn(turn_id, key, s.next_turn_seq, input, policy, now, agent)
        s.next_turn_seq += 1
        if idempotency is not None:
            s.idempotency[idempotency.key] = (turn_id, idempotency.digest)
        s.turns[turn_id] = turn
        s.turn_order.append(turn_id)
        s.active.append(turn_id)
        self._add_events(s, turn_id, [rules.queued_event(turn)], now)
        return turn, True

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        s = self._sessions.get(key)
        return s.turns.get(turn_id) if s is not None else None

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]:
        s = self._get(key)
        turns = [s.turns[t] for t in s.turn_order if s.turns[t].seq > after_seq]
        return turns[:limit]

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        s = self._get(key)
        return [s.turns[t] for t in s.active]

    async def end_waiting_turn(
        self,
        key: SessionKey,
        turn_id: str,
        reason: Reason,
        *,
        status: CancelStatus = "cancelled",
    ) -> Turn | None:
        s = self._get(key)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status not in ("queued", "awaiting_input"):
            return None
        now = time.time()
        for slot, d in list(s.decisions.items()):
            if slot[0] == turn_id and d.pending:
                s.decisions[slot] = done = rules.dropped(d, now)
                event = rules.decision_made_event(done, s.last_event_seq(turn_id))
                self._add_events(s, turn_id, [event], now)
        calls = rules.unanswered_calls(i for i in s.items if i.turn_id == turn_id)
        self._add_items(s, turn_id, rules.aborted_results(calls), now)
        ending = rules.waiting_ending(status, reason, turn)
        held = s.held.pop(turn_id, None)
        done_turn = self._finish(s, turn, ending, terminal=True)
        s.next_item_seq += rules.ITEM_SEQ_GAP
        if held and rules.keeps_memory(ending.status):
            self._apply_memory(held)
        return done_turn

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        s = self._get(key)
        now = time.time()
        if s.lease_owner is not None and s.lease_expires_at > now:
            return None
        return self._grant(s, key, owner, now + ttl)

    async def lease_holder(self, key: SessionKey) -> str | None:
        s = self._get(key)
        return s.lease_owner if s.lease_expires_at > time.time() else None

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        s = self._get(key)
        if s.lease_owner != from_owner:
            return None
        return self._grant(s, key, owner, time.time() + ttl)

    @staticmethod
    def _grant(s: SessionState, key: SessionKey, owner: str, expires_at: float) -> Lease:
        s.lease_token += 1  # every acquisition is a new token: the old owner's writes fail
        s.lease_owner = owner
        s.lease_expires_at = expires_at
        return Lease(
            key,
            owner,
            s.lease_token,
            expires_at,
            left_running=any(s.turns[t].status == "running" for t in s.active),
            queue=tuple(s.active),
            history_seq=s.next_item_seq,
        )

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        now = time.time()
        kept: list[Lease] = []
        for lease in leases:
            s = self._sessions.get(lease.key)
            if s is not None and s.lease_token == lease.token and s.lease_owner == lease.owner:
                s.lease_expires_at = now + ttl
                kept.append(replace(lease, expires_at=s.lease_expires_at))
        return kept

    async def release_lease(self, lease: Lease) -> None:
        self._release(lease)

    def _release(self, lease: Lease) -> None:
        s = self._sessions.get(lease.key)
        if s is not None and s.lease_token == lease.token:
            s.lease_owner = None
            s.lease_expires_at = 0.0

    # -- fenced writes -------------------------------------------------------------------------
    def _in_status(
        self, lease: Lease, turn_id: str, status: TurnStatus = "running"
    ) -> SessionState:
        s = self._fenced(lease)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status != status:
            raise rules.not_in_status(turn_id, status)
        return s

    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        s = self._in_status(lease, turn_id, "queued")
        if s.turns[turn_id].started_at is not None:  # decided and waiting: resume_turn's
            raise rules.not_in_status(turn_id, "queued")
        if s.first_active() != turn_id:  # the session's order is the store's to keep
            raise rules.not_next(turn_id)
        # Every check before the first change: a refused write changes nothing, as a rolled
        # back transaction would not.
        rules.check_event_seqs(turn_id, s.last_event_seq(turn_id), [e.seq for e in events])
        now = time.time()
        s.turns[turn_id] = replace(s.turns[turn_id], status="running", started_at=now)
        out = self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        return out

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        s = self._in_status(lease, turn_id)
        rules.check_event_seqs(turn_id, s.last_event_seq(turn_id), [e.seq for e in events])
        now = time.time()
        out = self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        return out

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> Turn:
        return self._end(lease, turn_id, ending, items, events, memory)

    def _end(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None,
    ) -> Turn:
        s = self._in_status(lease, turn_id)
        rules.check_event_seqs(turn_id, s.last_event_seq(turn_id), [e.seq for e in events])
        if memory:
            for record, _ in memory.put:
                if record.id in self._seq_of:
                    raise Conflict(f"a memory record with id {record.id!r} exists")
        now = time.time()
        self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        done = self._finish(s, s.turns[turn_id], ending, terminal=False)
        if memory and rules.keeps_memory(ending.status):
            self._apply_memory(memory)
        return done

    async def end_turn_released(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
        memory: MemoryWrites | None = None,
    ) -> tuple[Turn, bool]:
        # No await between the ending and the release: one write, as far as others can tell.
        done = self._end(lease, turn_id, ending, items, events, memory)
        if self._sessions[lease.key].active:
            return done, False  # a turn is left to run: the lease stays
        self._release(lease)
        return done, True

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
        s = self._in_status(lease, turn_id)
        rules.check_event_seqs(turn_id, s.last_event_seq(turn_id), [e.seq for e in events])
        slot = (turn_id, decision.call_id)
        if slot in s.decisions:
            raise Conflict(f"turn {turn_id} already has a decision on call {decision.call_id}")
        now = time.time()
        self._add_items(s, turn_id, items, now)
        self._add_events(s, turn_id, events, now)
        s.decisions[slot] = replace(decision, key=lease.key, turn_id=turn_id)
        if memory:
            s.held[turn_id] = memory
        s.turns[turn_id] = parked = rules.parked(s.turns[turn_id], usage)
        return parked

    async def resume_turn(
        self, lease: Lease, turn_id: str, events: Sequence[NewEvent]
    ) -> tuple[list[Item], MemoryWrites | None]:
        s = self._in_status(lease, turn_id, "queued")
        if s.turns[turn_id].started_at is None:
            raise rules.not_in_status(turn_id, "awaiting_input")
        rules.check_event_seqs(turn_id, s.last_event_seq(turn_id), [e.seq for e in events])
        s.turns[turn_id] = replace(s.turns[turn_id], status="running")
        self._add_events(s, turn_id, events, time.time())
        return [i for i in s.items if i.turn_id == turn_id], s.held.pop(turn_id, None)

    async def set_state(self, lease: Lease, name: str, value: Any) -> None:
        s = self._fenced(lease)
        s.record = replace(
            s.record,
            state=rules.with_state(copy.deepcopy(s.record.state), name, copy.deepcopy(value)),
            revision=s.record.revision + 1,
        )
        s.touch(time.time())

    async def recover(self, lease: Lease) -> list[Turn]:
        s = self._fenced(lease)
        out = []
        for tid in list(s.active):
            turn = s.turns[tid]
            if turn.status != "running":
                continue
            calls = rules.unanswered_calls(i for i in s.items if i.turn_id == tid)
            self._add_items(s, tid, rules.aborted_results(calls), time.time())
            out.append(self._finish(s, turn, rules.owner_lost(turn), terminal=True))
        return out

    @staticmethod
    def _add_items(
        s: SessionState, turn_id: str, items: Sequence[NewItem], now: float
    ) -> list[Item]:
        out = rules.stored_items(turn_id, s.next_item_seq, items, now)
        s.next_item_seq += len(out)
        s.items.extend(out)
        if out:
            s.touch(now)
        return out

    @staticmethod
    def _add_events(s: SessionState, turn_id: str, events: Sequence[NewEvent], now: float) -> None:
        log = s.events.setdefault(turn_id, [])
        log.extend(Event(turn_id, e.seq, e.type, e.data, now) for e in events)
        if any(a.seq > b.seq for a, b in itertools.pairwise(log[-len(events) - 1 :])):
            log.sort(key=lambda e: e.seq)  # kept in seq order, as the other backends read it

    def _finish(self, s: SessionState, turn: Turn, ending: TurnEnding, *, terminal: bool) -> Turn:
        effect = rules.items_effect(ending.status)
        if effect == "delete":
            s.items = [i for i in s.items if i.turn_id != turn.id]
        elif effect == "exclude":
            s.items = [replace(i, excluded=True) if i.turn_id == turn.id else i for i in s.items]
        now = time.time()
        done = rules.ended(turn, ending, now)
        s.turns[turn.id] = done
        if turn.id in s.active:
            s.active.remove(turn.id)
        if terminal:
            event = rules.terminal_event(turn.id, ending, s.last_event_seq(turn.id))
            self._add_events(s, turn.id, [event], now)
        return done

    # -- cancel requests and events --------------------------------------------------------------
    async def request_cancel(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> bool:
        s = self._sessions.get(key)
        turn = s.turns.get(turn_id) if s is not None else None
        if turn is None or turn.status != "running" or turn_id in self._cancels:
            return False
        self._cancels[turn_id] = (status, reason)
        return True

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        return {t: self._cancels[t] for t in turn_ids if t in self._cancels}

    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        s = self._sessions.get(key)
        if s is None or turn_id not in s.turns:
            return []
        return [e for e in s.events.get(turn_id, []) if e.seq > after_seq][:limit]

    # -- decisions -------------------------------------------------------------------------------
    async def list_decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
        limit: int = 100,
    ) -> list[Decision]:
        s = self._get(key)
        out = [
            d
            for (t, _), d in s.decisions.items()
            if (turn_id is None or t == turn_id) and (status is None or d.status == status)
        ]
        return out[:limit]

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
        s = self._sessions.get(key)
        d = s.decisions.get((turn_id, call_id)) if s is not None else None
        if s is None or d is None:
            raise DecisionNotFound("decision not found")
        now = time.time()
        done = rules.settle(d, verdict, answer, by, now)
        self._close_decision(s, done, now)
        if done.status == "always":
            s.record = replace(
                s.record,
                state=rules.with_always(s.record.state, str(d.payload["tool"])),
                revision=s.record.revision + 1,
            )
            s.touch(now)
        return done

    def _close_decision(self, s: SessionState, done: Decision, now: float) -> None:
        s.decisions[(done.turn_id, done.call_id)] = done
        self._add_events(
            s, done.turn_id, [rules.decision_made_event(done, s.last_event_seq(done.turn_id))], now
        )
        turn = s.turns[done.turn_id]
        if turn.status == "awaiting_input":
            s.turns[done.turn_id] = replace(turn, status="queued")

    async def expire_decisions(self, now: float, limit: int = 100) -> list[SessionKey]:
        keys: list[SessionKey] = []
        for k, s in self._sessions.items():
            for d in list(s.decisions.values()):
                if len(keys) >= limit:
                    return keys
                if d.pending and d.deadline <= now:
                    self._close_decision(s, rules.expired(d, now), now)
                    keys.append(k)
        return keys

    async def next_decision_deadline(self) -> float | None:
        deadlines = [
            d.deadline for s in self._sessions.values() for d in s.decisions.values() if d.pending
        ]
        return min(deadlines, default=None)
