"""Sessions, their history, API keys and sweeping, for the PostgreSQL store."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from tether.errors import Conflict, SessionNotFound
from tether.records import ApiKey, Item, SessionKey, SessionOrder, SessionRecord, SessionStats
from tether.store import rules
from tether.store.postgres import queries as q
from tether.store.postgres.connection import Connection
from tether.store.postgres.recall_steps import drop_conversation_memory, drop_session_memory
from tether.store.postgres.steps import count, lock_session
from tether.store.rows import api_key_row, item_row, key_args, session_row


class Sessions(Connection):
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
        def values() -> tuple[Any, ...]:
            """The new row's columns, as INSERT_SESSION and tether_create_session take them
            (but for the owner's bound, which the function takes before the idle TTL)."""
            now = time.time()
            expires = now + ttl_seconds if ttl_seconds is not None else None
            return (*key_args(key), agent, meta, now, expires, rules.initial_token())

        idle_ttl = ttl_seconds if idle else None

        meta = json.dumps(metadata or {})
        async with self._conn() as conn:
            while max_sessions is not None:
                row = await conn.fetchrow(q.CREATE_SESSION, *values(), max_sessions, idle_ttl)
                assert row is not None  # a function with OUT parameters answers one row
                outcome, held, *made = row
                if outcome == "created":
                    return session_row(made), True
                if outcome == "exists":
                    if not exist_ok:
                        raise Conflict("a session with this id already exists")
                    return session_row(made), False
                if outcome == "full":
                    rules.admit_session(max_sessions, int(held))  # LimitExceeded
                # 'raced': one made without a bound took the id meanwhile; ask again (it is
                # 'exists' then, unless it went again too).
            while True:
                row = await conn.fetchrow(q.INSERT_SESSION, *values(), idle_ttl)
                if row is not None:
                    return session_row(row), True
                if not exist_ok:
                    raise Conflict("a session with this id already exists")
                row = await conn.fetchrow(q.GET_SESSION, *key_args(key))
                if row is not None:  # else it was deleted in between: insert again
                    return session_row(row), False

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        row = await self._fetchrow(q.GET_SESSION, *key_args(key))
        return session_row(row) if row is not None else None

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
        n = max(limit, 0)
        if order == "newest":
            past = rules.parse_newest_cursor(after)
            stamp, last = past if past is not None else (None, None)
            rows = await self._fetch(
                q.LIST_SESSIONS_NEWEST, tenant, owner, n, stamp, last, contains
            )
        elif after is None:
            rows = await self._fetch(q.LIST_SESSIONS, tenant, owner, n, contains)
        else:
            rows = await self._fetch(q.LIST_SESSIONS_AFTER, tenant, owner, n, after, contains)
        return [session_row(r) for r in rows]

    async def update_session(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        now = time.time()
        async with self._conn() as conn:
            # One conditional statement: the revision check and the write are one atomic step.
            row = await conn.fetchrow(
                q.UPDATE_SESSION,
                *key_args(key),
                json.dumps(metadata) if metadata is not None else None,
                json.dumps(state) if state is not None else None,
                now + ttl_seconds if ttl_seconds is not None else None,
                now,
                expected_revision,
            )
            if row is None:
                revision = await conn.fetchval(q.SESSION_REVISION, *key_args(key))
                if revision is None:
                    raise SessionNotFound("session not found")
                raise Conflict(f"session revision is {revision}, not {expected_revision}")
        return session_row(row)

    async def delete_session(self, key: SessionKey) -> bool:
        async with self._tx() as conn:
            if await conn.fetchval(q.DELETE_SESSION, *key_args(key)) is None:
                return False
            # Its items, turns and events go by cascade; its own memory scope goes with them.
            await drop_session_memory(conn, key)
            return True

    async def session_stats(self, key: SessionKey) -> SessionStats:
        row = await self._fetchrow(q.SESSION_STATS, *key_args(key))
        if row is None:
            raise SessionNotFound("session not found")
        agents = tuple(row[4] or ())
        return SessionStats(int(row[0]), int(row[1]), int(row[2]), int(row[3]), agents)

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        rows = await self._rows_of(key, q.LIST_ITEMS, after_seq, max(limit, 0))
        return [item_row(r) for r in rows]

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        before = before_seq if before_seq is not None else 1 << 62
        async with self._conn() as conn:
            rows = await conn.fetch(q.RECENT_ITEMS, *key_args(key), before, max(limit, 0))
            if not rows:
                await self._pk(conn, key)  # SessionNotFound when it is the session that is missing
        return [item_row(r) for r in rows]

    async def latest_summary(self, key: SessionKey) -> Item | None:
        # A failed turn's items are excluded and a rolled-back turn's are gone.
        rows = await self._rows_of(key, q.LATEST_SUMMARY)
        return item_row(rows[0]) if rows else None

    async def latest_handoff(self, key: SessionKey) -> Item | None:
        rows = await self._rows_of(key, q.LATEST_HANDOFF)
        return item_row(rows[0]) if rows else None

    async def clear_items(self, key: SessionKey) -> int:
        async with self._tx() as conn:
            pk = int((await lock_session(conn, key))[0])
            rules.refuse_if_busy(await conn.fetchval(q.FIRST_ACTIVE_TURN, pk))
            cleared = count(await conn.execute(q.CLEAR_ITEMS, pk))
            await conn.execute(q.CLEAR_TURNS, pk)
            await conn.execute(q.SKIP_ITEM_SEQS, pk, rules.ITEM_SEQ_GAP)
            await drop_conversation_memory(conn, key)
            return cleared

    # -- API keys ------------------------------------------------------------------------------
    async def create_api_key(self, key: ApiKey) -> None:
        roles = json.dumps(sorted(key.roles))
        async with self._conn() as conn:
            try:
                await conn.execute(
                    q.INSERT_API_KEY, key.id, key.tenant, key.user, roles, key.hash, key.created_at
                )
            except asyncpg.UniqueViolationError as exc:
                raise Conflict("an API key with this id exists") from exc

    async def api_key_by_hash(self, digest: str) -> ApiKey | None:
        row = await self._fetchrow(q.API_KEY_BY_HASH, digest)
        return api_key_row(row) if row is not None else None

    async def list_api_keys(self) -> list[ApiKey]:
        return [api_key_row(r) for r in await self._fetch(q.LIST_API_KEYS)]

    async def revoke_api_key(self, key_id: str) -> bool:
        return await self._fetchval(q.REVOKE_API_KEY, key_id, time.time()) is not None

    async def count_api_keys(self) -> int:
        return int(await self._fetchval(q.COUNT_API_KEYS))

    # -- maintenance ---------------------------------------------------------------------------
    async def sweep_expired(self, now: float, limit: int = 500) -> list[SessionKey]:
        async with self._tx() as conn:
            swept = [SessionKey(*r) for r in await conn.fetch(q.SWEEP_EXPIRED, now, limit)]
            for key in swept:
                await drop_session_memory(conn, key)
        return swept

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        rows = await self._fetch(q.SESSIONS_NEEDING_WORK, unowned_at)
        return [SessionKey(r[0], r[1], r[2]) for r in rows]
