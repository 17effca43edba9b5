"""SQLite store: one file, WAL, one writer thread.

sqlite3 is a blocking driver, so every call runs on a single dedicated thread that owns the
connection (never on the event loop). One thread is also the right amount of parallelism for
SQLite, which admits one writer at a time; each public method is one function shipped to that
thread and one transaction, so a call costs a single thread hop.

Writes use ``BEGIN IMMEDIATE``: the write lock is taken before the fencing check is read, so the
check and the write it guards are one atomic step even with several processes on one file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tether.errors import (
    Conflict,
    QueueFull,
    SessionNotFound,
    StoreError,
)
from tether.records import (
    ABORTED_TOOL_RESULT,
    ApiKey,
    CancelStatus,
    Event,
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
from tether.store import sqlite_sql as sql
from tether.store.rows import cancel_json, cancel_of, item_row, session_row, turn_row
from tether.store.rules import DEFAULT_MAX_QUEUE, initial_token
from tether.store.sqlite_memory import SQLiteRecall
from tether.store.sqlite_worker import SQLiteWorker

T = TypeVar("T")


class SQLiteStore(SQLiteRecall):
    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        self.path = Path(path)
        # WAL + NORMAL survives any process crash (kill -9); FULL also survives power loss.
        self._synchronous = synchronous
        self._worker: SQLiteWorker | None = None

    # -- plumbing ------------------------------------------------------------------------------
    async def _call(self, fn: Callable[[sqlite3.Connection], T], write: bool) -> T:
        worker = self._worker
        if worker is None:
            raise StoreError("the store is not open")
        try:
            return await worker.call(fn, write=write)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {exc.__class__.__name__}") from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A read."""
        return await self._call(fn, False)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write: atomic on its own, possibly committed with others (group commit)."""
        return await self._call(fn, True)

    async def open(self) -> None:
        if self._worker is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        worker = SQLiteWorker(self._connect)
        try:
            await worker.start()
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: cannot open {self.path}: {exc}") from exc
        self._worker = worker

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA busy_timeout=10000")
        # A bigger page cache keeps the hot B-tree pages of long sessions in memory.
        conn.execute("PRAGMA cache_size=-32000")
        sql.migrate(conn)
        return conn

    async def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.stop()

    async def ping(self) -> None:
        await self._run(lambda c: c.execute("SELECT 1").fetchone())

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
        def do(c: sqlite3.Connection) -> tuple[SessionRecord, bool]:
            now = time.time()
            cur = c.execute(
                "INSERT INTO sessions (tenant, owner, session_id, agent, metadata, created_at,"
                " updated_at, expires_at, lease_token) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (tenant, owner, session_id) DO NOTHING",
                (
                    key.tenant,
                    key.owner,
                    key.session_id,
                    agent,
                    json.dumps(metadata or {}),
                    now,
                    now,
                    now + ttl_seconds if ttl_seconds is not None else None,
                    initial_token(),
                ),
            )
            created = cur.rowcount == 1
            if not created and not exist_ok:
                raise Conflict("a session with this id already exists")
            row = c.execute(
                f"SELECT {sql.SESSION_COLS} FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            return session_row(row), created

        return await self._write(do)

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        def do(c: sqlite3.Connection) -> SessionRecord | None:
            row = c.execute(
                f"SELECT {sql.SESSION_COLS} FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            return session_row(row) if row else None

        return await self._run(do)

    async def list_sessions(
        self, tenant: str, owner: str, *, limit: int = 50, after: str | None = None
    ) -> list[SessionRecord]:
        def do(c: sqlite3.Connection) -> list[SessionRecord]:
            rows = c.execute(
                f"SELECT {sql.SESSION_COLS} FROM sessions WHERE tenant = ? AND owner = ?"
                " AND session_id > ? ORDER BY session_id LIMIT ?",
                (tenant, owner, after or "", limit),
            ).fetchall()
            return [session_row(r) for r in rows]

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
            row = c.execute(
                f"SELECT {sql.SESSION_COLS} FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            rec = session_row(row)
            if expected_revision is not None and rec.revision != expected_revision:
                raise Conflict(f"session revision is {rec.revision}, not {expected_revision}")
            now = time.time()
            c.execute(
                f"UPDATE sessions SET metadata = ?, state = ?, expires_at = ?, updated_at = ?,"
                f" revision = revision + 1 WHERE {sql.KEY_WHERE}",
                (
                    json.dumps(metadata if metadata is not None else rec.metadata),
                    json.dumps(state if state is not None else rec.state),
                    now + ttl_seconds if ttl_seconds is not None else rec.expires_at,
                    now,
                    key.tenant,
                    key.owner,
                    key.session_id,
                ),
            )
            row = c.execute(
                f"SELECT {sql.SESSION_COLS} FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            return session_row(row)

        return await self._write(do)

    async def delete_session(self, key: SessionKey) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                f"DELETE FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            )
            return cur.rowcount == 1

        return await self._write(do)

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = sql.session_pk(c, key)
            rows = c.execute(
                f"SELECT {sql.ITEM_COLS} FROM items WHERE session_pk = ? AND seq > ?"
                " ORDER BY seq LIMIT ?",
                (pk, after_seq, limit),
            ).fetchall()
            return [item_row(r) for r in rows]

        return await self._run(do)

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = sql.session_pk(c, key)
            rows = c.execute(
                f"SELECT {sql.ITEM_COLS} FROM items WHERE session_pk = ? AND seq < ?"
                " AND excluded = 0 ORDER BY seq DESC LIMIT ?",
                (pk, before_seq if before_seq is not None else 1 << 62, limit),
            ).fetchall()
            return [item_row(r) for r in rows]

        return await self._run(do)

    async def latest_summary(self, key: SessionKey) -> Item | None:
        def do(c: sqlite3.Connection) -> Item | None:
            # A failed turn's items are excluded and a rolled-back turn's are gone.
            row = c.execute(
                f"SELECT {sql.ITEM_COLS} FROM items WHERE session_pk = ? AND kind = 'summary'"
                " AND excluded = 0 ORDER BY seq DESC LIMIT 1",
                (sql.session_pk(c, key),),
            ).fetchone()
            return item_row(row) if row else None

        return await self._run(do)

    async def clear_items(self, key: SessionKey) -> int:
        def do(c: sqlite3.Connection) -> int:
            pk = sql.session_pk(c, key)
            sql.raise_if_active(c, pk)
            return c.execute("DELETE FROM items WHERE session_pk = ?", (pk,)).rowcount

        return await self._write(do)

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
        def do(c: sqlite3.Connection) -> Turn:
            row = c.execute(
                f"SELECT pk, expires_at FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            if row[1] is not None and row[1] <= time.time():
                raise SessionNotFound("the session has expired")
            pk = int(row[0])
            if policy == "reject":
                sql.raise_if_active(c, pk)
            queued = c.execute(
                "SELECT id FROM turns WHERE session_pk = ? AND status = 'queued' ORDER BY seq",
                (pk,),
            ).fetchall()
            if len(queued) >= max_queue:
                raise QueueFull(
                    f"the session already has {len(queued)} queued turns",
                    busy_turn_id=queued[0][0],
                )
            (seq,) = c.execute(
                "UPDATE sessions SET next_turn_seq = next_turn_seq + 1 WHERE pk = ?"
                " RETURNING next_turn_seq - 1",
                (pk,),
            ).fetchone()
            now = time.time()
            try:
                c.execute(
                    "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at)"
                    " VALUES (?, ?, ?, ?, ?, 'queued', ?)",
                    (turn_id, pk, seq, input, policy, now),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"turn {turn_id} already exists") from exc
            c.execute(
                "INSERT INTO events (turn_id, seq, type, data, created_at) VALUES (?, 1, ?, ?, ?)",
                (turn_id, "turn.queued", json.dumps({"seq": seq}), now),
            )
            return Turn(
                turn_id,
                key,
                seq,
                input,
                policy,
                "queued",
                None,
                None,
                None,
                False,
                Usage(),
                now,
                None,
                None,
            )

        return await self._write(do)

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        def do(c: sqlite3.Connection) -> Turn | None:
            try:
                pk = sql.session_pk(c, key)
            except SessionNotFound:
                return None
            return sql.get_turn(c, pk, turn_id)

        return await self._run(do)

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]:
        def do(c: sqlite3.Connection) -> list[Turn]:
            pk = sql.session_pk(c, key)
            rows = c.execute(
                f"SELECT {sql.TURN_COLS} FROM turns t JOIN sessions s ON s.pk = t.session_pk"
                " WHERE t.session_pk = ? AND t.seq > ? ORDER BY t.seq LIMIT ?",
                (pk, after_seq, limit),
            ).fetchall()
            return [turn_row(r) for r in rows]

        return await self._run(do)

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        def do(c: sqlite3.Connection) -> list[Turn]:
            pk = sql.session_pk(c, key)
            rows = c.execute(
                f"SELECT {sql.TURN_COLS} FROM turns t JOIN sessions s ON s.pk = t.session_pk"
                " WHERE t.session_pk = ? AND t.status IN ('queued', 'running') ORDER BY t.seq",
                (pk,),
            ).fetchall()
            return [turn_row(r) for r in rows]

        return await self._run(do)

    async def cancel_queued_turn(
        self, key: SessionKey, turn_id: str, reason: Reason
    ) -> Turn | None:
        def do(c: sqlite3.Connection) -> Turn | None:
            pk = sql.session_pk(c, key)
            turn = sql.get_turn(c, pk, turn_id)
            if turn is None or turn.status != "queued":
                return None
            return sql.finish_turn(c, pk, turn, TurnEnding(status="cancelled", reason=reason), True)

        return await self._write(do)

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        def do(c: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = c.execute(
                "UPDATE sessions SET lease_owner = ?, lease_token = lease_token + 1,"
                " lease_expires_at = ?"
                f" WHERE {sql.KEY_WHERE} AND (lease_owner IS NULL OR lease_expires_at <= ?)"
                " RETURNING lease_token",
                (owner, now + ttl, key.tenant, key.owner, key.session_id, now),
            ).fetchone()
            if row is None:
                sql.session_pk(c, key)  # SessionNotFound when it is the session that is missing
                return None
            return Lease(key, owner, int(row[0]), now + ttl)

        return await self._write(do)

    async def lease_holder(self, key: SessionKey) -> str | None:
        def do(c: sqlite3.Connection) -> str | None:
            row = c.execute(
                f"SELECT lease_owner, lease_expires_at FROM sessions WHERE {sql.KEY_WHERE}",
                (key.tenant, key.owner, key.session_id),
            ).fetchone()
            if row is None:
                raise SessionNotFound("session not found")
            return row[0] if row[0] is not None and row[1] > time.time() else None

        return await self._run(do)

    async def take_over_lease(
        self, key: SessionKey, owner: str, ttl: float, from_owner: str
    ) -> Lease | None:
        def do(c: sqlite3.Connection) -> Lease | None:
            now = time.time()
            row = c.execute(
                "UPDATE sessions SET lease_owner = ?, lease_token = lease_token + 1,"
                f" lease_expires_at = ? WHERE {sql.KEY_WHERE} AND lease_owner = ?"
                " RETURNING lease_token",
                (owner, now + ttl, key.tenant, key.owner, key.session_id, from_owner),
            ).fetchone()
            return Lease(key, owner, int(row[0]), now + ttl) if row else None

        return await self._write(do)

    async def renew_leases(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        def do(c: sqlite3.Connection) -> list[Lease]:
            now = time.time()
            kept = []
            for lease in leases:
                k = lease.key
                cur = c.execute(
                    f"UPDATE sessions SET lease_expires_at = ? WHERE {sql.KEY_WHERE}"
                    " AND lease_token = ? AND lease_owner = ?",
                    (now + ttl, k.tenant, k.owner, k.session_id, lease.token, lease.owner),
                )
                if cur.rowcount == 1:
                    kept.append(Lease(k, lease.owner, lease.token, now + ttl))
            return kept

        return await self._write(do)

    async def release_lease(self, lease: Lease) -> None:
        def do(c: sqlite3.Connection) -> None:
            k = lease.key
            c.execute(
                "UPDATE sessions SET lease_owner = NULL, lease_expires_at = 0"
                f" WHERE {sql.KEY_WHERE} AND lease_token = ?",
                (k.tenant, k.owner, k.session_id, lease.token),
            )

        await self._write(do)

    # -- fenced writes -------------------------------------------------------------------------

    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = sql.fenced_pk(c, lease)
            cur = c.execute(
                "UPDATE turns SET status = 'running', started_at = ?"
                " WHERE id = ? AND session_pk = ? AND status = 'queued'",
                (time.time(), turn_id, pk),
            )
            if cur.rowcount != 1:
                raise Conflict(f"turn {turn_id} is not queued")
            return sql.add_rows(c, pk, turn_id, items, events)

        return await self._write(do)

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        def do(c: sqlite3.Connection) -> list[Item]:
            pk = sql.fenced_pk(c, lease)
            # Turn ids are unique across sessions here, so without this check the events of
            # another session's turn could be written under this session's lease.
            row = c.execute(
                "SELECT 1 FROM turns WHERE id = ? AND session_pk = ? AND status = 'running'",
                (turn_id, pk),
            ).fetchone()
            if row is None:
                raise Conflict(f"turn {turn_id} is not running")
            return sql.add_rows(c, pk, turn_id, items, events)

        return await self._write(do)

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
    ) -> Turn:
        def do(c: sqlite3.Connection) -> Turn:
            pk = sql.fenced_pk(c, lease)
            turn = sql.get_turn(c, pk, turn_id)
            if turn is None or turn.status != "running":
                raise Conflict(f"turn {turn_id} is not running")
            sql.add_rows(c, pk, turn_id, items, events)
            return sql.finish_turn(c, pk, turn, ending, False)

        return await self._write(do)

    async def recover(self, lease: Lease) -> list[Turn]:
        def nothing_to_do(c: sqlite3.Connection) -> bool:
            # Only a lease holder starts turns, so while we hold the lease no turn can start
            # running behind this read: "nothing running" stays true without a write lock.
            pk = sql.fenced_pk(c, lease)
            row = c.execute(
                "SELECT 1 FROM turns WHERE session_pk = ? AND status = 'running' LIMIT 1", (pk,)
            ).fetchone()
            return row is None

        if await self._run(nothing_to_do):
            return []

        def do(c: sqlite3.Connection) -> list[Turn]:
            pk = sql.fenced_pk(c, lease)
            rows = c.execute(
                f"SELECT {sql.TURN_COLS} FROM turns t JOIN sessions s ON s.pk = t.session_pk"
                " WHERE t.session_pk = ? AND t.status = 'running' ORDER BY t.seq",
                (pk,),
            ).fetchall()
            out = []
            for turn in map(turn_row, rows):
                orphans = c.execute(
                    "SELECT call_id, tool_name FROM items c WHERE c.session_pk = ?"
                    " AND c.turn_id = ? AND c.kind = 'tool_call' AND NOT EXISTS ("
                    "  SELECT 1 FROM items r WHERE r.session_pk = c.session_pk"
                    "  AND r.turn_id = c.turn_id AND r.kind = 'tool_result'"
                    "  AND r.call_id = c.call_id) ORDER BY c.seq",
                    (pk, turn.id),
                ).fetchall()
                sql.add_rows(
                    c,
                    pk,
                    turn.id,
                    [
                        NewItem("tool_result", ABORTED_TOOL_RESULT, call_id=o[0], tool_name=o[1])
                        for o in orphans
                    ],
                    [],
                )
                ending = TurnEnding(
                    status="failed",
                    reason="owner_lost",
                    error="the process running the turn was lost",
                )
                out.append(sql.finish_turn(c, pk, turn, ending, True))
            return out

        return await self._write(do)

    async def request_cancel(
        self, key: SessionKey, turn_id: str, status: CancelStatus, reason: Reason
    ) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            try:
                pk = sql.session_pk(c, key)
            except SessionNotFound:
                return False
            cur = c.execute(
                "UPDATE turns SET cancel_request = ? WHERE id = ? AND session_pk = ?"
                " AND status = 'running' AND cancel_request IS NULL",
                (cancel_json(status, reason), turn_id, pk),
            )
            return cur.rowcount == 1

        return await self._write(do)

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        ids = list(turn_ids)

        def do(c: sqlite3.Connection) -> dict[str, tuple[CancelStatus, Reason]]:
            marks = ",".join("?" * len(ids))
            rows = c.execute(
                f"SELECT id, cancel_request FROM turns WHERE id IN ({marks})"
                " AND cancel_request IS NOT NULL",
                ids,
            ).fetchall()
            out = {}
            for turn_id, raw in rows:
                out[turn_id] = cancel_of(raw)
            return out

        if not ids:
            return {}
        return await self._run(do)

    # -- events --------------------------------------------------------------------------------
    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        def do(c: sqlite3.Connection) -> list[Event]:
            try:
                pk = sql.session_pk(c, key)
            except SessionNotFound:
                return []
            rows = c.execute(
                "SELECT e.seq, e.last_seq, e.type, e.data, e.created_at FROM events e"
                " JOIN turns t ON t.id = e.turn_id WHERE e.turn_id = ? AND t.session_pk = ?"
                " AND COALESCE(e.last_seq, e.seq) > ? ORDER BY e.seq LIMIT ?",
                (turn_id, pk, after_seq, limit),
            ).fetchall()
            out: list[Event] = []
            for seq, last_seq, type_, data, created in rows:
                if last_seq is None:
                    out.append(Event(turn_id, seq, type_, json.loads(data), created))
                    continue
                for offset, text in enumerate(json.loads(data)["texts"]):
                    if seq + offset > after_seq:
                        out.append(Event(turn_id, seq + offset, type_, {"text": text}, created))
            return out[:limit]

        return await self._run(do)

    async def session_stats(self, key: SessionKey) -> SessionStats:
        def do(c: sqlite3.Connection) -> SessionStats:
            pk = sql.session_pk(c, key)
            (items,) = c.execute(
                "SELECT COUNT(*) FROM items WHERE session_pk = ?", (pk,)
            ).fetchone()
            turns, active = c.execute(
                "SELECT COUNT(*), COALESCE(SUM(status IN ('queued', 'running')), 0) FROM turns"
                " WHERE session_pk = ?",
                (pk,),
            ).fetchone()
            return SessionStats(items, turns, active)

        return await self._run(do)

    async def create_api_key(self, key: ApiKey) -> None:
        def do(c: sqlite3.Connection) -> None:
            try:
                c.execute(
                    "INSERT INTO api_keys (id, tenant, user_id, roles, hash, created_at)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        key.id,
                        key.tenant,
                        key.user,
                        json.dumps(sorted(key.roles)),
                        key.hash,
                        key.created_at,
                    ),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict("an API key with this id exists") from exc

        await self._write(do)

    async def api_key_by_hash(self, digest: str) -> ApiKey | None:
        def do(c: sqlite3.Connection) -> ApiKey | None:
            row = c.execute(
                "SELECT id, tenant, user_id, roles, hash, created_at, revoked_at FROM api_keys"
                " WHERE hash = ?",
                (digest,),
            ).fetchone()
            return sql.api_key_row(row) if row else None

        return await self._run(do)

    async def list_api_keys(self) -> list[ApiKey]:
        def do(c: sqlite3.Connection) -> list[ApiKey]:
            rows = c.execute(
                "SELECT id, tenant, user_id, roles, hash, created_at, revoked_at FROM api_keys"
                " ORDER BY created_at"
            ).fetchall()
            return [sql.api_key_row(r) for r in rows]

        return await self._run(do)

    async def revoke_api_key(self, key_id: str) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            cur = c.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (time.time(), key_id),
            )
            return cur.rowcount == 1

        return await self._write(do)

    async def count_api_keys(self) -> int:
        def do(c: sqlite3.Connection) -> int:
            (n,) = c.execute("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL").fetchone()
            return int(n)

        return await self._run(do)

    async def sweep_expired(self, now: float, limit: int = 500) -> int:
        def do(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "DELETE FROM sessions WHERE pk IN (SELECT s.pk FROM sessions s"
                " WHERE s.expires_at IS NOT NULL AND s.expires_at <= ?"
                " AND (s.lease_owner IS NULL OR s.lease_expires_at <= ?)"
                " AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_pk = s.pk"
                "  AND t.status IN ('queued', 'running')) LIMIT ?)",
                (now, now, limit),
            )
            return cur.rowcount

        return await self._write(do)

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        def do(c: sqlite3.Connection) -> list[SessionKey]:
            rows = c.execute(
                "SELECT DISTINCT s.tenant, s.owner, s.session_id FROM turns t"
                " JOIN sessions s ON s.pk = t.session_pk WHERE t.status IN ('queued', 'running')"
                " AND (? IS NULL OR s.lease_owner IS NULL OR s.lease_expires_at <= ?)",
                (unowned_at, unowned_at),
            ).fetchall()
            return [SessionKey(*r) for r in rows]

        return await self._run(do)
