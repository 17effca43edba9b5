"""PostgreSQL store: asyncpg, a connection pool, one transaction per call.

asyncpg is a native asyncio driver, so nothing here blocks the event loop. Transactions run at
READ COMMITTED (set explicitly, whatever the server default): every statement sees what was
committed before it started, so once a transaction holds a session's row lock, the reads that
follow see the latest state of that session.

Fencing is the row lock: a fenced write first locks its session row (``SELECT … FOR UPDATE``)
and compares the lease token, in the same transaction as the writes. Acquiring or taking over a
lease is a conditional ``UPDATE … RETURNING`` of that same row, so it either commits before the
lock (and the write then reads the new token and raises StaleLease) or waits until the write
has committed under a token that was current.

Driver and socket errors never leave this module: they become :class:`StoreError` (HTTP 503),
or InvalidInput for a value PostgreSQL cannot hold (text with a NUL character).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, Protocol, cast
from urllib.parse import urlsplit

import asyncpg  # type: ignore[import-untyped]

from tether.errors import (
    ConfigError,
    Conflict,
    InvalidInput,
    QueueFull,
    SessionBusy,
    SessionNotFound,
    StoreError,
)
from tether.records import (
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
from tether.store import postgres_schema as q
from tether.store.postgres_memory import PostgresRecall
from tether.store.postgres_writes import (
    Conn,
    Row,
    add,
    fail_running_turns,
    fenced_pk,
    finish,
    key_args,
    lock_session,
)

# The row shapes are the SQLite store's, so both backends return the very same records.
from tether.store.rows import cancel_json, cancel_of, item_row, session_row, turn_row
from tether.store.rules import DEFAULT_MAX_QUEUE, initial_token


class _Pool(Protocol):
    def acquire(self, *, timeout: float | None = None) -> AbstractAsyncContextManager[Conn]: ...
    async def close(self) -> None: ...
    def terminate(self) -> None: ...


_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


def _translate(exc: BaseException) -> NoReturn:
    """Re-raise a driver or socket error as the tether error it means."""
    if isinstance(exc, asyncpg.ClientConfigurationError):
        raise ConfigError(f"invalid PostgreSQL URL: {exc}") from exc
    if isinstance(exc, asyncpg.DataError):
        # A value PostgreSQL cannot hold (text with a NUL, an int past 64 bits): the caller's.
        raise InvalidInput(f"PostgreSQL cannot store this value: {exc}") from exc
    raise StoreError(f"postgresql: {exc.__class__.__name__}: {exc}") from exc


# How the cancel listener's connection shows in pg_stat_activity.
LISTENER_NAME = "tether-cancel-listener"


class PostgresStore(PostgresRecall):
    def __init__(
        self, url: str, *, min_size: int = 1, max_size: int = 10, connect_timeout: float = 10.0
    ) -> None:
        self.url = url
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = connect_timeout
        self._pool: _Pool | None = None

    def __repr__(self) -> str:
        parts = urlsplit(self.url)  # never the password
        return f"PostgresStore({parts.hostname}:{parts.port or 5432}{parts.path})"

    # -- plumbing ------------------------------------------------------------------------------
    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        if self._pool is None:
            raise StoreError("the store is not open")
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                yield conn
        except _DRIVER_ERRORS as exc:
            _translate(exc)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Conn]:
        async with self._conn() as conn, conn.transaction(isolation="read_committed"):
            yield conn

    async def _fetch(self, sql: str, *args: Any) -> list[Row]:
        async with self._conn() as conn:
            return await conn.fetch(sql, *args)

    async def _fetchrow(self, sql: str, *args: Any) -> Row | None:
        async with self._conn() as conn:
            return await conn.fetchrow(sql, *args)

    async def _fetchval(self, sql: str, *args: Any) -> Any:
        async with self._conn() as conn:
            return await conn.fetchval(sql, *args)

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            pool = cast(
                _Pool,
                await asyncpg.create_pool(
                    self.url,
                    min_size=self._min_size,
                    max_size=self._max_size,
                    timeout=self._timeout,
                ),
            )
        except _DRIVER_ERRORS as exc:
            _translate(exc)
        try:
            async with pool.acquire(timeout=self._timeout) as conn:
                await self._migrate(conn)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, _DRIVER_ERRORS):
                _translate(exc)
            raise
        self._pool = pool

    @staticmethod
    async def _migrate(conn: Conn) -> None:
        # Server processes starting together on a fresh database take turns on this lock; the
        # later ones find every migration recorded. READ COMMITTED matters here: the version
        # read after the lock must see what the previous holder committed.
        async with conn.transaction(isolation="read_committed"):
            await conn.execute("SELECT pg_advisory_xact_lock($1)", q.MIGRATION_LOCK)
            await conn.execute(q.VERSION_TABLE)
            current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
            for version, sql in q.MIGRATIONS:
                if version > current:
                    await conn.execute(sql)
                    await conn.execute(
                        "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                        version,
                        time.time(),
                    )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            # Waits for connections in use to come back; a call stuck on a lock does not get
            # to hold up shutdown for longer than this.
            async with asyncio.timeout(self._timeout):
                await pool.close()
        except _DRIVER_ERRORS:  # TimeoutError among them
            pool.terminate()

    async def ping(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._fetchval("SELECT 1")
        except TimeoutError as exc:  # the deadline's own, which _conn does not see
            raise StoreError(f"postgresql: no answer within {self._timeout} s") from exc

    async def _pk(self, conn: Conn, key: SessionKey) -> int:
        pk = await conn.fetchval(q.SESSION_PK, *key_args(key))
        if pk is None:
            raise SessionNotFound("session not found")
        return int(pk)

    async def _rows_of(self, key: SessionKey, sql: str, *args: Any) -> list[Row]:
        """Rows of ``sql`` (``$1`` is the session's pk); SessionNotFound without the session."""
        async with self._conn() as conn:
            return await conn.fetch(sql, await self._pk(conn, key), *args)

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
        async with self._conn() as conn:
            while True:
                now = time.time()
                row = await conn.fetchrow(
                    q.INSERT_SESSION,
                    *key_args(key),
                    agent,
                    json.dumps(metadata or {}),
                    now,
                    now + ttl_seconds if ttl_seconds is not None else None,
                    initial_token(),
                )
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
        self, tenant: str, owner: str, *, limit: int = 50, after: str | None = None
    ) -> list[SessionRecord]:
        if after is None:
            rows = await self._fetch(q.LIST_SESSIONS, tenant, owner, max(limit, 0))
        else:
            rows = await self._fetch(q.LIST_SESSIONS_AFTER, tenant, owner, max(limit, 0), after)
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
        return await self._fetchval(q.DELETE_SESSION, *key_args(key)) is not None

    # -- items ---------------------------------------------------------------------------------
    async def list_items(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Item]:
        return [
            item_row(r) for r in await self._rows_of(key, q.LIST_ITEMS, after_seq, max(limit, 0))
        ]

    async def recent_items(
        self, key: SessionKey, *, before_seq: int | None = None, limit: int = 64
    ) -> list[Item]:
        before = before_seq if before_seq is not None else 1 << 62
        return [
            item_row(r) for r in await self._rows_of(key, q.RECENT_ITEMS, before, max(limit, 0))
        ]

    async def latest_summary(self, key: SessionKey) -> Item | None:
        # A failed turn's items are excluded and a rolled-back turn's are gone.
        rows = await self._rows_of(key, q.LATEST_SUMMARY)
        return item_row(rows[0]) if rows else None

    async def clear_items(self, key: SessionKey) -> int:
        async with self._tx() as conn:
            pk = int((await lock_session(conn, key))[0])
            await self._raise_if_active(conn, pk)
            tag = await conn.execute(q.CLEAR_ITEMS, pk)
        return int(tag.rsplit(" ", 1)[-1])  # the row count of "DELETE n"

    @staticmethod
    async def _raise_if_active(conn: Conn, pk: int) -> None:
        busy = await conn.fetchval(q.FIRST_ACTIVE_TURN, pk)
        if busy is not None:
            raise SessionBusy("a turn is queued or running", busy_turn_id=busy)

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
        async with self._tx() as conn:
            # The session row lock makes the busy and queue-bound checks hold until commit.
            pk, _, expires_at = await lock_session(conn, key)
            if expires_at is not None and expires_at <= time.time():
                raise SessionNotFound("the session has expired")
            if policy == "reject":
                await self._raise_if_active(conn, pk)
            queued = await conn.fetch(q.QUEUED_TURN_IDS, pk)
            if len(queued) >= max_queue:
                raise QueueFull(
                    f"the session already has {len(queued)} queued turns",
                    busy_turn_id=queued[0][0],
                )
            seq = int(await conn.fetchval(q.NEXT_TURN_SEQ, pk))
            now = time.time()
            if await conn.fetchval(q.INSERT_TURN, turn_id, pk, seq, input, policy, now) is None:
                raise Conflict(f"turn {turn_id} already exists")  # rolls the seq back too
            await conn.execute(
                q.INSERT_EVENT, turn_id, 1, "turn.queued", json.dumps({"seq": seq}), now
            )
        return Turn(
            id=turn_id,
            key=key,
            seq=seq,
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

    async def listen_cancels(self, heard: Callable[[str], None], ready: Callable[[], None]) -> None:
        """Call ``heard(turn_id)`` for each cancel request any process makes, until the link drops.

        A connection of its own, outside the pool: a pooled connection is reset (``UNLISTEN *``)
        whenever it goes back. Returns when PostgreSQL closes the connection (a restart) and
        raises :class:`StoreError` when it cannot connect; the caller listens again.
        """
        try:
            conn = await asyncpg.connect(
                self.url,
                timeout=self._timeout,
                server_settings={"application_name": LISTENER_NAME},
            )
        except _DRIVER_ERRORS as exc:
            _translate(exc)
        lost = asyncio.Event()

        def on_notify(_c: object, _pid: int, _channel: str, payload: str) -> None:
            heard(payload)

        try:
            conn.add_termination_listener(lambda _c: lost.set())
            await conn.add_listener(q.CANCEL_CHANNEL, on_notify)
            ready()
            while not lost.is_set() and not conn.is_closed():
                # A silent network drop does not close the socket: probe it now and then.
                try:
                    await asyncio.wait_for(lost.wait(), timeout=5.0)
                except TimeoutError:
                    await conn.fetchval("SELECT 1", timeout=self._timeout)
        except _DRIVER_ERRORS as exc:
            _translate(exc)
        finally:
            conn.terminate()

    async def cancel_requests(
        self, turn_ids: Sequence[str]
    ) -> dict[str, tuple[CancelStatus, Reason]]:
        if not turn_ids:
            return {}
        out = {}
        for turn_id, raw in await self._fetch(q.CANCEL_REQUESTS, list(turn_ids)):
            out[turn_id] = cancel_of(raw)
        return out

    async def get_turn(self, key: SessionKey, turn_id: str) -> Turn | None:
        row = await self._fetchrow(q.GET_TURN_BY_KEY, *key_args(key), turn_id)
        return turn_row(row) if row is not None else None

    async def list_turns(
        self, key: SessionKey, *, after_seq: int = 0, limit: int = 100
    ) -> list[Turn]:
        return [
            turn_row(r) for r in await self._rows_of(key, q.LIST_TURNS, after_seq, max(limit, 0))
        ]

    async def active_turns(self, key: SessionKey) -> list[Turn]:
        return [turn_row(r) for r in await self._rows_of(key, q.ACTIVE_TURNS)]

    async def cancel_queued_turn(
        self, key: SessionKey, turn_id: str, reason: Reason
    ) -> Turn | None:
        async with self._tx() as conn:
            # Locked like a fenced write, so the turn cannot start between the check and the end.
            pk = int((await lock_session(conn, key))[0])
            row = await conn.fetchrow(q.GET_TURN, pk, turn_id)
            if row is None or row[7] != "queued":
                return None
            ending = TurnEnding(status="cancelled", reason=reason)
            return await finish(conn, pk, turn_row(row), ending, True)

    # -- leases --------------------------------------------------------------------------------
    async def acquire_lease(self, key: SessionKey, owner: str, ttl: float) -> Lease | None:
        now = time.time()
        async with self._conn() as conn:
            # Conditional on the lease being free or expired: of racing acquirers, the first to
            # update the row wins; the others re-check it after that commit and match nothing.
            token = await conn.fetchval(q.ACQUIRE_LEASE, *key_args(key), owner, now + ttl, now)
            if token is None:
                await self._pk(conn, key)  # SessionNotFound when it is the session that is missing
                return None
        return Lease(key, owner, int(token), now + ttl)

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
                await self._pk(conn, key)  # as the memory store: SessionNotFound when missing
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
        async with self._conn() as conn:
            await conn.execute(q.RELEASE_LEASE, *key_args(lease.key), lease.token)

    # -- fenced writes -------------------------------------------------------------------------
    async def start_turn(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        async with self._tx() as conn:
            pk = await fenced_pk(conn, lease)
            if await conn.fetchval(q.START_TURN, pk, turn_id, time.time()) is None:
                raise Conflict(f"turn {turn_id} is not queued")
            return await add(conn, pk, turn_id, items, events)

    async def append(
        self, lease: Lease, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
    ) -> list[Item]:
        async with self._tx() as conn:
            pk = await fenced_pk(conn, lease)
            # Turn ids are unique across sessions, so without the session in this check the
            # events of another session's turn could be written under this session's lease.
            if await conn.fetchval(q.TURN_IS_RUNNING, pk, turn_id) is None:
                raise Conflict(f"turn {turn_id} is not running")
            return await add(conn, pk, turn_id, items, events)

    async def end_turn(
        self,
        lease: Lease,
        turn_id: str,
        ending: TurnEnding,
        items: Sequence[NewItem],
        events: Sequence[NewEvent],
    ) -> Turn:
        async with self._tx() as conn:
            pk = await fenced_pk(conn, lease)
            row = await conn.fetchrow(q.GET_TURN, pk, turn_id)
            if row is None or row[7] != "running":
                raise Conflict(f"turn {turn_id} is not running")
            await add(conn, pk, turn_id, items, events)
            return await finish(conn, pk, turn_row(row), ending, False)

    async def recover(self, lease: Lease) -> list[Turn]:
        async with self._tx() as conn:
            return await fail_running_turns(conn, await fenced_pk(conn, lease))

    # -- events --------------------------------------------------------------------------------
    async def list_events(
        self, key: SessionKey, turn_id: str, *, after_seq: int = 0, limit: int = 1000
    ) -> list[Event]:
        limit = max(limit, 0)
        rows = await self._fetch(q.LIST_EVENTS, *key_args(key), turn_id, after_seq, limit)
        out: list[Event] = []
        for seq, last_seq, type_, data, created in rows:
            if last_seq is None:
                out.append(Event(turn_id, seq, type_, json.loads(data), created))
                continue
            for offset, text in enumerate(json.loads(data)["texts"]):  # a run of text deltas
                if seq + offset > after_seq:
                    out.append(Event(turn_id, seq + offset, type_, {"text": text}, created))
        return out[:limit]

    async def session_stats(self, key: SessionKey) -> SessionStats:
        row = await self._fetchrow(q.SESSION_STATS, *key_args(key))
        if row is None:
            raise SessionNotFound("session not found")
        return SessionStats(int(row[0]), int(row[1]), int(row[2]))

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

    @staticmethod
    def _api_key(row: Row) -> ApiKey:
        return ApiKey(row[0], row[1], row[2], frozenset(json.loads(row[3])), row[4], row[5], row[6])

    async def api_key_by_hash(self, digest: str) -> ApiKey | None:
        row = await self._fetchrow(q.API_KEY_BY_HASH, digest)
        return self._api_key(row) if row is not None else None

    async def list_api_keys(self) -> list[ApiKey]:
        return [self._api_key(r) for r in await self._fetch(q.LIST_API_KEYS)]

    async def revoke_api_key(self, key_id: str) -> bool:
        return await self._fetchval(q.REVOKE_API_KEY, key_id, time.time()) is not None

    async def count_api_keys(self) -> int:
        return int(await self._fetchval(q.COUNT_API_KEYS))

    # -- maintenance ---------------------------------------------------------------------------
    async def sweep_expired(self, now: float, limit: int = 500) -> int:
        status: str = await self._fetchval_status(q.SWEEP_EXPIRED, now, limit)
        return int(status.rsplit(" ", 1)[-1]) if status else 0

    async def _fetchval_status(self, sql: str, *args: Any) -> str:
        async with self._conn() as conn:
            result: str = await conn.execute(sql, *args)
            return result

    async def sessions_needing_work(self, *, unowned_at: float | None = None) -> list[SessionKey]:
        rows = await self._fetch(q.SESSIONS_NEEDING_WORK, unowned_at)
        return [SessionKey(r[0], r[1], r[2]) for r in rows]
