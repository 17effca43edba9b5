"""Sessions, their history, API keys and sweeping, for the in-memory store."""

from __future__ import annotations

import bisect
import time
from dataclasses import replace
from typing import Any

from tether.errors import Conflict
from tether.records import ApiKey, Item, SessionKey, SessionOrder, SessionRecord, SessionStats
from tether.store import rules
from tether.store.inmemory.state import SessionState, State


class Sessions(State):
    # -- sessions ------------------------------------------------------------------------------
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
        existing = self._sessions.get(key)
        if existing is not None:
            if exist_ok:
                return existing.record, False
            raise Conflict("a session with this id already exists")
        if max_sessions is not None:
            owned = sum(1 for k in self._sessions if (k.tenant, k.owner) == (key.tenant, key.owner))
            rules.admit_session(max_sessions, owned)
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
        self._sessions[key] = SessionState(record, idle_ttl=ttl_seconds if idle else None)
        return record, True

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        s = self._sessions.get(key)
        return s.record if s is not None else None

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
        mine = (
            s.record for k, s in self._sessions.items() if (k.tenant, k.owner) == (tenant, owner)
        )
        return rules.listed(mine, order=order, after=after, contains=contains, limit=limit)

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
        if ttl_seconds is not None:
            s.idle_ttl = None  # a TTL of its own from now on
        s.record = replace(
            rec,
            metadata=dict(metadata) if metadata is not None else rec.metadata,
            state=dict(state) if state is not None else rec.state,
            expires_at=now + ttl_seconds if ttl_seconds is not None else rec.expires_at,
            revision=rec.revision + 1,
        )
        s.touch(now)
        return s.record

    async def delete_session(self, key: SessionKey) -> bool:
        if self._sessions.pop(key, None) is None:
            return False
        self._drop_session_memory(key)
        return True

    async def session_stats(self, key: SessionKey) -> SessionStats:
        s = self._get(key)
        parked = sum(1 for t in s.active if s.turns[t].status == "awaiting_input")
        turns = s.turns.values()  # in seq order
        names = (n for t in turns for n in (t.agent.name if t.agent else None, t.ran_by) if n)
        agents = tuple(dict.fromkeys(names))
        return SessionStats(len(s.items), len(s.turns), len(s.active), parked, agents)

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
        return self._latest(key, "summary")

    async def latest_handoff(self, key: SessionKey) -> Item | None:
        return self._latest(key, "handoff")

    def _latest(self, key: SessionKey, kind: str) -> Item | None:
        # A failed turn's items are excluded and a rolled-back turn's are gone.
        items = self._get(key).items
        return next((i for i in reversed(items) if i.kind == kind and not i.excluded), None)

    async def clear_items(self, key: SessionKey) -> int:
        s = self._get(key)
        rules.refuse_if_busy(s.first_active())
        n = len(s.items)
        s.items.clear()
        s.next_item_seq += rules.ITEM_SEQ_GAP
        # Refused while a turn is active (above): every turn has ended; they go, events too.
        for turn_id in s.turn_order:
            self._cancels.pop(turn_id, None)
        s.turns.clear()
        s.turn_order.clear()
        s.events.clear()
        s.idempotency.clear()
        s.decisions.clear()
        self._drop_conversation_memory(key)
        return n

    # -- API keys ------------------------------------------------------------------------------
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

    # -- maintenance ---------------------------------------------------------------------------
    async def sweep_expired(self, now: float, limit: int = 500) -> list[SessionKey]:
        doomed = [
            k
            for k, s in self._sessions.items()
            if rules.sweepable(
                s.record.expires_at,
                now,
                active=bool(s.active),
                lease_owner=s.lease_owner,
                lease_expires_at=s.lease_expires_at,
            )
        ][:limit]
        for k in doomed:
            del self._sessions[k]
            self._drop_session_memory(k)
        return doomed

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        return [
            k
            for k, s in self._sessions.items()
            if s.active
            and not s.parked()
            and (unowned_at is None or s.lease_owner is None or s.lease_expires_at <= unowned_at)
        ]
