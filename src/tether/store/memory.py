"""The in-memory store: the runnable specification of :class:`tether.store.base.Store`.

Every method runs to completion without awaiting, so on one event loop each call is atomic —
the same guarantee a database transaction gives the other backends.
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tether.errors import Conflict, QueueFull, SessionBusy, SessionNotFound, StaleLease
from tether.records import (
    ABORTED_TOOL_RESULT,
    ApiKey,
    CancelStatus,
    Event,
    ForgetReport,
    Item,
    Lease,
    NewEvent,
    NewItem,
    Policy,
    Reason,
    SessionKey,
    SessionRecord,
    SessionStats,
    Turn,
    TurnEnding,
    Usage,
)
from tether.store.memory_recall import MemoryRecall
from tether.store.rules import DEFAULT_MAX_QUEUE, initial_token, terminal_event_data


@dataclass
class _Session:
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
    lease_token: int = field(default_factory=initial_token)
    lease_expires_at: float = 0.0


class MemoryStore(MemoryRecall):
    def __init__(self) -> None:
        super().__init__()
        self._sessions: dict[SessionKey, _Session] = {}
        self._keys: dict[str, ApiKey] = {}
        self._cancels: dict[str, tuple[CancelStatus, Reason]] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ping(self) -> None:
        return None

    def _get(self, key: SessionKey) -> _Session:
        s = self._sessions.get(key)
        if s is None:
            raise SessionNotFound("session not found")
        return s

    # -- sessions ------------------------------------------------------------------------------
    async def create_session(
        self,
        key: SessionKey,
        agent: str,
        *,
        metadata: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        exist_ok: bool = False,
    ) -> tuple[SessionRecord, bool]:
        existing = self._sessions.get(key)
        if existing is not None:
            if exist_ok:
                return existing.record, False
            raise Conflict("a session with this id already exists")
        now = time.time()
        record = SessionRecord(
            key=key,
            agent=agent,
            metadata=dict(metadata or {}),
            state={},
            created_at=now,
            updated_at=now,
            expires_at=now + ttl_seconds if ttl_seconds is not None else None,
            revision=1,
        )
        self._sessions[key] = _Session(record)
        return record, True

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        s = self._sessions.get(key)
        return s.record if s is not None else None

    async def list_sessions(
        self, tenant: str, owner: str, *, limit: int = 50, after: str | None = None
    ) -> list[SessionRecord]:
        ids = sorted(
            k.session_id
            for k in self._sessions
            if k.tenant == tenant and k.owner == owner and (after is None or k.session_id > after)
        )
        return [self._sessions[SessionKey(tenant, owner, i)].record for i in ids[:limit]]

    async def update_session(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        s = self._get(key)
        rec = s.record
        if expected_revision is not None and rec.revision != expected_revision:
            raise Conflict(f"session revision is {rec.revision}, not {expected_revision}")
        now = time.time()
        s.record = replace(
            rec,
            metadata=dict(metadata) if metadata is not None else rec.metadata,
            state=dict(state) if state is not None else rec.state,
            expires_at=now + ttl_seconds if ttl_seconds is not None else rec.expires_at,
            updated_at=now,
            revision=rec.revision + 1,
        )
        return s.record

    async def delete_session(self, key: SessionKey) -> bool:
        return self._sessions.pop(key, None) is not None

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        items = self._get(key).items
        start = bisect.bisect_right([i.seq for i in items], after_seq)
        return items[start : start + limit]

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        out: list[Item] = []
        if limit <= 0:
            return out
        for item in reversed(self._get(key).items):
            if before_seq is not None and item.seq >= before_seq:
                continue
            if item.excluded:
                continue
            out.append(item)
            if len(out) >= limit:
                break
        return out

    async def latest_summary(self, key: SessionKey) -> Item | None:
        # A failed turn's items are excluded and a rolled-back turn's are gone.
        items = self._get(key).items
        return next((i for i in reversed(items) if i.kind == "summary" and not i.excluded), None)

    async def clear_items(self, key: SessionKey) -> int:
        s = self._get(key)
        active = [s.turns[t] for t in s.active]
        if active:
            raise SessionBusy("a turn is queued or running", busy_turn_id=active[0].id)
        n = len(s.items)
        s.items.clear()
        return n

    # -- turns ---------------------------------------------------------------------------------
    async def enqueue_turn(
        self,
        key: SessionKey,
        *,
        turn_id: str,
        input: str,
        policy: Policy,
        max_queue: int = DEFAULT_MAX_QUEUE,
    ) -> Turn:
        s = self._get(key)
        if s.record.expires_at is not None and s.record.expires_at <= time.time():
            raise SessionNotFound("the session has expired")
        if turn_id in s.turns:
            raise Conflict(f"turn {turn_id} already exists")
        active = [s.turns[t] for t in s.active]
        if policy == "reject" and active:
            raise SessionBusy("a turn is already queued or running", busy_turn_id=active[0].id)
        queued = [t for t in active if t.status == "queued"]
        if len(queued) >= max_queue:
            raise QueueFull(
                f"the session already has {len(queued)} queued turns", busy_turn_id=queued[0].id
            )
        now = time.time()
        turn = Turn(
            id=turn_id,
            key=key,
            seq=s.next_turn_seq,
            input=input,
            policy=policy,
            status="queued",
            reason=None,
            error=None,
            output=None,
            complete=False,
            usage=Usage(),
            created_at=now,
            started_at=None,
            ended_at=None,
        )
        s.next_turn_seq += 1
        s.turns[turn_id] = turn
        s.turn_order.append(turn_id)
        s.active.append(turn_id)
        s.events[turn_id] = [Event(turn_id, 1, "turn.queued", {"seq": turn.seq}, now)]
        return turn

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

    async def cancel_queued_turn(
        self, key: SessionKey, turn_id: str, reason: Reason
    ) -> Turn | None:
        s = self._get(key)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status != "queued":
            return None
        ending = TurnEnding(status="cancelled", reason=reason)
        return self._finish(s, turn, ending, [_terminal(s, turn, ending)])

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        s = self._get(key)
        now = time.time()
        if s.lease_owner is not None and s.lease_expires_at > now:
            return None
        s.lease_token += 1
        s.lease_owner = owner
        s.lease_expires_at = now + ttl
        return Lease(key, owner, s.lease_token, s.lease_expires_at)

    async def lease_holder(self, key: SessionKey) -> str | None:
        s = self._get(key)
        return s.lease_owner if s.lease_expires_at > time.time() else None

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        s = self._get(key)
        if s.lease_owner != from_owner:
            return None
        s.lease_token += 1
        s.lease_owner = owner
        s.lease_expires_at = time.time() + ttl
        return Lease(key, owner, s.lease_token, s.lease_expires_at)

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
        s = self._sessions.get(lease.key)
        if s is not None and s.lease_token == lease.token:
            s.lease_owner = None
            s.lease_expires_at = 0.0

    # -- fenced writes -------------------------------------------------------------------------
    def _fenced(self, lease: Lease) -> _Session:
        s = self._sessions.get(lease.key)
        if s is None:
            raise SessionNotFound("session not found")
        if s.lease_token != lease.token:
            raise StaleLease(f"lease token {lease.token} is stale (current {s.lease_token})")
        return s

    def _add_items(self, s: _Session, turn_id: str, items: Sequence[NewItem]) -> list[Item]:
        now = time.time()
        out = []
        for new in items:
            item = Item(
                seq=s.next_item_seq,
                turn_id=turn_id,
                kind=new.kind,
                content=new.content,
                complete=new.complete,
                call_id=new.call_id,
                tool_name=new.tool_name,
                arguments=new.arguments,
                meta=dict(new.meta),
                created_at=now,
            )
            s.next_item_seq += 1
            s.items.append(item)
            out.append(item)
        return out

    @staticmethod
    def _check_events(s: _Session, turn_id: str, events: Sequence[NewEvent]) -> None:
        # Checked before anything is written: a rejected write must change nothing, as a
        # rolled back transaction would not.
        log = s.events.get(turn_id, [])
        last = log[-1].seq if log else 0
        seqs = [e.seq for e in events]
        if seqs == sorted(set(seqs)) and (not seqs or seqs[0] > last):
            return  # the usual case: new seqs, in order
        taken = {e.seq for e in log}
        for seq in seqs:
            if seq in taken:
                raise Conflict(f"event seq {seq} of turn {turn_id} already written")
            taken.add(seq)

    def _add_events(self, s: _Session, turn_id: str, events: Sequence[NewEvent]) -> None:
        now = time.time()
        log = s.events.setdefault(turn_id, [])
        log.extend(Event(turn_id, e.seq, e.type, e.data, now) for e in events)
        if any(a.seq > b.seq for a, b in itertools.pairwise(log[-len(events) - 1 :])):
            log.sort(key=lambda e: e.seq)  # kept in seq order, as the other backends read it

    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        s = self._fenced(lease)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status != "queued":
            raise Conflict(f"turn {turn_id} is not queued")
        self._check_events(s, turn_id, events)
        s.turns[turn_id] = replace(turn, status="running", started_at=time.time())
        out = self._add_items(s, turn_id, items)
        self._add_events(s, turn_id, events)
        return out

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        s = self._fenced(lease)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status != "running":
            raise Conflict(f"turn {turn_id} is not running")
        self._check_events(s, turn_id, events)
        out = self._add_items(s, turn_id, items)
        self._add_events(s, turn_id, events)
        return out

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
    ) -> Turn:
        s = self._fenced(lease)
        turn = s.turns.get(turn_id)
        if turn is None or turn.status != "running":
            raise Conflict(f"turn {turn_id} is not running")
        self._check_events(s, turn_id, events)
        self._add_items(s, turn_id, items)
        self._add_events(s, turn_id, events)
        return self._finish(s, turn, ending, [])

    def _finish(
        self, s: _Session, turn: Turn, ending: TurnEnding, extra_events: list[Event]
    ) -> Turn:
        if ending.status == "rolled_back":
            s.items = [i for i in s.items if i.turn_id != turn.id]
        elif ending.status == "failed":
            s.items = [replace(i, excluded=True) if i.turn_id == turn.id else i for i in s.items]
        done = replace(
            turn,
            status=ending.status,
            reason=ending.reason,
            error=ending.error,
            output=ending.output,
            complete=ending.complete,
            usage=ending.usage,
            ended_at=time.time(),
        )
        s.turns[turn.id] = done
        if turn.id in s.active:
            s.active.remove(turn.id)
        s.events.setdefault(turn.id, []).extend(extra_events)
        return done

    async def recover(self, lease: Lease) -> list[Turn]:
        s = self._fenced(lease)
        out = []
        for tid in list(s.active):
            turn = s.turns[tid]
            if turn.status != "running":
                continue
            answered = {i.call_id for i in s.items if i.turn_id == tid and i.kind == "tool_result"}
            orphans = [
                i
                for i in s.items
                if i.turn_id == tid and i.kind == "tool_call" and i.call_id not in answered
            ]
            self._add_items(
                s,
                tid,
                [
                    NewItem(
                        "tool_result", ABORTED_TOOL_RESULT, call_id=o.call_id, tool_name=o.tool_name
                    )
                    for o in orphans
                ],
            )
            ending = TurnEnding(
                status="failed", reason="owner_lost", error="the process running the turn was lost"
            )
            out.append(self._finish(s, turn, ending, [_terminal(s, turn, ending)]))
        return out

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

    # -- events --------------------------------------------------------------------------------
    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        s = self._sessions.get(key)
        if s is None or turn_id not in s.turns:
            return []
        return [e for e in s.events.get(turn_id, []) if e.seq > after_seq][:limit]

    async def session_stats(self, key: SessionKey) -> SessionStats:
        s = self._get(key)
        active = len(s.active)
        return SessionStats(len(s.items), len(s.turns), active)

    async def create_api_key(self, key: ApiKey) -> None:
        if key.id in self._keys:
            raise Conflict("an API key with this id exists")
        self._keys[key.id] = key

    async def api_key_by_hash(self, digest: str) -> ApiKey | None:
        return next((k for k in self._keys.values() if k.hash == digest), None)

    async def list_api_keys(self) -> list[ApiKey]:
        return sorted(self._keys.values(), key=lambda k: k.created_at)

    async def revoke_api_key(self, key_id: str) -> bool:
        k = self._keys.get(key_id)
        if k is None or k.revoked_at is not None:
            return False
        self._keys[key_id] = replace(k, revoked_at=time.time())
        return True

    async def count_api_keys(self) -> int:
        return sum(1 for k in self._keys.values() if k.revoked_at is None)

    async def sweep_expired(self, now: float, limit: int = 500) -> int:
        doomed = [
            k
            for k, s in self._sessions.items()
            if s.record.expires_at is not None
            and s.record.expires_at <= now
            and not s.active
            and (s.lease_owner is None or s.lease_expires_at <= now)
        ][:limit]
        for k in doomed:
            del self._sessions[k]
        return len(doomed)

    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        doomed = [k for k in self._sessions if k.tenant == tenant and k.owner == user]
        for k in doomed:
            for turn_id in self._sessions.pop(k).turns:
                self._cancels.pop(turn_id, None)
        memory, documents = self._forget_recall(tenant, user)
        return ForgetReport(sessions=len(doomed), memory=memory, documents=documents)

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        return [
            k
            for k, s in self._sessions.items()
            if s.active
            and (unowned_at is None or s.lease_owner is None or s.lease_expires_at <= unowned_at)
        ]


def _terminal(s: _Session, turn: Turn, ending: TurnEnding) -> Event:
    log = s.events.get(turn.id, [])
    seq = log[-1].seq + 1 if log else 1
    return Event(turn.id, seq, "turn.ended", terminal_event_data(turn.id, ending), time.time())
