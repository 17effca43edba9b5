"""Sessions, their history, API keys and sweeping, for the SQLite store.

Each method is one function run on the store's thread (:mod:`.connection`); a write is one
``BEGIN IMMEDIATE`` transaction, so every check it makes holds until it commits.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from tether.errors import Conflict, SessionNotFound
from tether.records import ApiKey, Item, SessionKey, SessionOrder, SessionRecord, SessionStats
from tether.store import rules
from tether.store.rows import api_key_row, item_row, key_args, session_row
from tether.store.sqlite import queries as q
from tether.store.sqlite.connection import Connection
from tether.store.sqlite.recall_steps import drop_conversation_memory, drop_session_memory
from tether.store.sqlite.steps import first_active, session_pk


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
        def do(c: sqlite3.Connection) -> tuple[SessionRecord, bool]:
            if max_sessions is not None:
                existing = c.execute(q.GET_SESSION, key_args(key)).fetchone()
                if existing is not None:
                    if not exist_ok:
                        raise Conflict("a session with this id already exists")
                    return session_row(existing), False
                (n,) = c.execute(q.OWNER_SESSIONS, (key.tenant, key.owner)).fetchone()
                rules.admit_session(max_sessions, int(n))
            now = time.time()
            expires = now + ttl_seconds if ttl_seconds is not None else None
            cur = c.execute(
                q.INSERT_SESSION,
                (
                    *key_args(key),
                    agent,
                    json.dumps(metadata or {}),
                    now,
                    now,
                    expires,
                    rules.initial_token(),
                    ttl_seconds if idle else None,
                ),
            )
            created = cur.rowcount == 1
            if not created and not exist_ok:
                raise Conflict("a session with this id already exists")
            return session_row(c.execute(q.GET_SESSION, key_args(key)).fetchone()), created

        return await self._write(do)

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        def do(c: sqlite3.Connection) -> SessionRecord | None:
            row = c.execute(q.GET_SESSION, key_args(key)).fetchone()
            return session_row(row) if row else None

        return await self._run(do)

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
        if order == "newest":
            past = rules.parse_newest_cursor(after)
            stamp, last = past if past is not None else (None, None)
            args: tuple[object, ...] = (
                *(tenant, owner, stamp, stamp, stamp, last),
                *(contains, contains, max(limit, 0)),
            )
            query = q.LIST_SESSIONS_NEWEST
        else:
            args = (tenant, owner, after or "", contains, contains, max(limit, 0))
            query = q.LIST_SESSIONS

        def do(c: sqlite3.Connection) -> list[SessionRecord]:
            return [session_row(r) for r in c.execute(query, args).fetchall()]

        return await self._run(do)

    async def update_session(
        self,
        key: SessionKey,
        *,
        metadata: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
        ttl_seconds: float | None = None,
        expected_revision: int | None = None,
    ) -> SessionRecord:
        def do(c: sqlite3.Connection) -> SessionRecord:
            row = c.execute(q.GET_SESSION, key_args(key)).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            rec = session_row(row)
            if expected_revision is not None and rec.revision != expected_revision:
                raise Conflict(f"session revision is {rec.revision}, not {expected_revision}")
            now = time.time()
            c.execute(
                q.UPDATE_SESSION,
                (
                    json.dumps(metadata if metadata is not None else rec.metadata),
                    json.dumps(state if state is not None else rec.state),
                    now + ttl_seconds if ttl_seconds is not None else rec.expires_at,
                    now,
                    ttl_seconds is not None,
                    *key_args(key),
                ),
            )
            return session_row(c.execute(q.GET_SESSION, key_args(key)).fetchone())

        return await self._write(do)

    async def delete_session(self, key: SessionKey) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            if c.execute(q.DELETE_SESSION, key_args(key)).fetchone() is None:
                return False
            # Its items, turns and events go by cascade; its own memory scope goes with them.
            drop_session_memory(c, key)
            return True

        return await self._write(do)

    async def session_stats(self, key: SessionKey) -> SessionStats:
        def do(c: sqlite3.Connection) -> SessionStats:
            pk = session_pk(c, key)
            (items,) = c.execute(q.COUNT_ITEMS, (pk,)).fetchone()
            turns, active, parked = c.execute(q.COUNT_TURNS, (pk,)).fetchone()
            agents = tuple(r[0] for r in c.execute(q.TURN_AGENTS, (pk, pk)))
            return SessionStats(items, turns, active, parked, agents)

        return await self._run(do)

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            rows = c.execute(q.LIST_ITEMS, (session_pk(c, key), after_seq, limit)).fetchall()
            return [item_row(r) for r in rows]

        return await self._run(do)

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        before = before_seq if before_seq is not None else 1 << 62

        def do(c: sqlite3.Connection) -> list[Item]:
            rows = c.execute(q.RECENT_ITEMS, (session_pk(c, key), before, limit)).fetchall()
            return [item_row(r) for r in rows]

        return await self._run(do)

    async def latest_summary(self, key: SessionKey) -> Item | None:
        return await self._latest(key, q.LATEST_SUMMARY)

    async def latest_handoff(self, key: SessionKey) -> Item | None:
        return await self._latest(key, q.LATEST_HANDOFF)

    async def _latest(self, key: SessionKey, query: str) -> Item | None:
        def do(c: sqlite3.Connection) -> Item | None:
            # A failed turn's items are excluded and a rolled-back turn's are gone.
            row = c.execute(query, (session_pk(c, key),)).fetchone()
            return item_row(row) if row else None

        return await self._run(do)

    async def clear_items(self, key: SessionKey) -> int:
        def do(c: sqlite3.Connection) -> int:
            pk = session_pk(c, key)
            rules.refuse_if_busy(first_active(c, pk))
            cleared = int(c.execute(q.CLEAR_ITEMS, (pk,)).rowcount)
            c.execute(q.CLEAR_TURNS, (pk,))
            c.execute(q.SKIP_ITEM_SEQS, (rules.ITEM_SEQ_GAP, pk))
            drop_conversation_memory(c, key)
            return cleared

        return await self._write(do)

    # -- API keys ------------------------------------------------------------------------------
    async def create_api_key(self, key: ApiKey) -> None:
        roles = json.dumps(sorted(key.roles))

        def do(c: sqlite3.Connection) -> None:
            try:
                c.execute(
                    q.INSERT_API_KEY,
                    (key.id, key.tenant, key.user, roles, key.hash, key.created_at),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict("an API key with this id exists") from exc

        await self._write(do)

    async def api_key_by_hash(self, digest: str) -> ApiKey | None:
        def do(c: sqlite3.Connection) -> ApiKey | None:
            row = c.execute(q.API_KEY_BY_HASH, (digest,)).fetchone()
            return api_key_row(row) if row else None

        return await self._run(do)

    async def list_api_keys(self) -> list[ApiKey]:
        def do(c: sqlite3.Connection) -> list[ApiKey]:
            return [api_key_row(r) for r in c.execute(q.LIST_API_KEYS).fetchall()]

        return await self._run(do)

    async def revoke_api_key(self, key_id: str) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            return c.execute(q.REVOKE_API_KEY, (time.time(), key_id)).rowcount == 1

        return await self._write(do)

    async def count_api_keys(self) -> int:
        def do(c: sqlite3.Connection) -> int:
            (n,) = c.execute(q.COUNT_API_KEYS).fetchone()
            return int(n)

        return await self._run(do)

    # -- maintenance ---------------------------------------------------------------------------
    async def sweep_expired(self, now: float, limit: int = 500) -> list[SessionKey]:
        def do(c: sqlite3.Connection) -> list[SessionKey]:
            swept = [SessionKey(*r) for r in c.execute(q.SWEEP_EXPIRED, (now, now, limit))]
            for key in swept:
                drop_session_memory(c, key)
            return swept

        return await self._write(do)

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        def do(c: sqlite3.Connection) -> list[SessionKey]:
            rows = c.execute(q.SESSIONS_NEEDING_WORK, (unowned_at, unowned_at)).fetchall()
            return [SessionKey(*r) for r in rows]

        return await self._run(do)
