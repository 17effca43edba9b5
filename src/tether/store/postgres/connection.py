"""The PostgreSQL store's connections: an asyncpg pool, one transaction per call.

asyncpg is a native asyncio driver, so nothing here blocks the event loop. Transactions run at
READ COMMITTED (set explicitly, whatever the server default): every statement sees what was
committed before it started, so once a transaction holds a session's row lock, the reads that
follow see the latest state of that session.

Fencing is the row lock: a fenced write first locks its session row (``SELECT … FOR UPDATE``)
and compares the lease token, in the same transaction as the writes. Acquiring or taking over a
lease is a conditional ``UPDATE … RETURNING`` of that same row, so it either commits before the
lock (and the write then reads the new token and raises StaleLease) or waits until the write
has committed under a token that was current.

Driver and socket errors never leave the store: they become :class:`StoreError` (HTTP 503),
or InvalidInput for a value PostgreSQL cannot hold (text with a NUL character).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn, Protocol, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]

from tether.errors import ConfigError, InvalidInput, SessionNotFound, StoreError
from tether.records import SessionKey
from tether.store.postgres import queries as q
from tether.store.postgres.migrations import migrate
from tether.store.postgres.steps import Conn, Row
from tether.store.rows import key_args


class _Pool(Protocol):
    def acquire(self, *, timeout: float | None = None) -> AbstractAsyncContextManager[Conn]: ...
    async def close(self) -> None: ...
    def terminate(self) -> None: ...


log = logging.getLogger(__name__)

DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


def translate(exc: BaseException) -> NoReturn:
    """Re-raise a driver or socket error as the tether error it means."""
    if isinstance(exc, asyncpg.ClientConfigurationError):
        raise ConfigError(f"invalid PostgreSQL URL: {exc}") from exc
    if isinstance(exc, asyncpg.DataError):
        # A value PostgreSQL cannot hold (text with a NUL, an int past 64 bits): the caller's.
        # The driver's words (query argument numbers, the value itself) stay in the log.
        log.info("postgresql refused a value: %s", exc)
        raise InvalidInput(_refused(exc)) from exc
    raise StoreError(f"postgresql: {exc.__class__.__name__}: {exc}") from exc


def _refused(exc: BaseException) -> str:
    if isinstance(exc, asyncpg.exceptions.CharacterNotInRepertoireError):
        return "text must not contain NUL characters"
    if isinstance(exc, asyncpg.exceptions.NumericValueOutOfRangeError) or isinstance(
        exc.__cause__, OverflowError
    ):
        return "a number is out of range (integers are at most 2**63 - 1)"
    return "a value cannot be stored"


DEFAULT_POOL_SIZE = 20
"""Connections a process keeps at most (the URL's ``pool_size`` parameter sets it). A store call
holds one for its statements only, never across a model call, so a process needs about as many
as it has store calls in flight at once (a turn's admission and its writes are one statement
each). Each server process (each ``--workers``) has a pool of its own and
one connection more for the cancel feed, all within the server's ``max_connections``."""


async def _keep(_conn: object) -> None:
    """The pool's reset of a connection given back: nothing to undo, so no round trip.

    asyncpg's default (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``) costs a
    round trip on every release, a quarter of a turn's statements. Nothing here leaves state on
    a pooled connection: advisory locks are transaction-scoped, no cursor outlives its
    transaction, the cancel feed LISTENs on a connection of its own, nothing SETs a session
    setting (the URL's server settings are the connection's own, set when it opens).
    """


def pool_settings(url: str) -> tuple[str, int]:
    """The URL without tether's own ``pool_size`` parameter, and that size (or the default)."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    sizes = [v for k, v in pairs if k == "pool_size"]
    if not sizes:
        return url, DEFAULT_POOL_SIZE
    try:
        size = int(sizes[-1])
    except ValueError:
        size = 0
    if not 1 <= size <= 10_000:
        raise ConfigError(
            f"invalid PostgreSQL URL: pool_size must be a whole number from 1 to 10000, "
            f"not {sizes[-1]!r}"
        )
    rest = urlencode([(k, v) for k, v in pairs if k != "pool_size"])
    return urlunsplit(parts._replace(query=rest)), size


class Connection:
    """Plumbing every role of :class:`~tether.store.postgres.PostgresStore` runs its calls on."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int = 1,
        max_size: int | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        url, size = pool_settings(url)
        self.url = url
        self._max_size = max_size or size
        self._min_size = min(min_size, self._max_size)
        self._timeout = connect_timeout
        self._pool: _Pool | None = None
        self.migrated: tuple[int, int] | None = None
        """The schema's version before and after this store's first open applied what it
        lacked (``tether db upgrade`` says it)."""

    def __repr__(self) -> str:
        parts = urlsplit(self.url)  # never the password
        return f"PostgresStore({parts.hostname}:{parts.port or 5432}{parts.path})"

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        if self._pool is None:
            raise StoreError("the store is not open")
        try:
            async with self._pool.acquire(timeout=self._timeout) as conn:
                yield conn
        except DRIVER_ERRORS as exc:
            translate(exc)

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

    async def _execute(self, sql: str, *args: Any) -> str:
        """The command tag (``DELETE 3``…) of one statement."""
        async with self._conn() as conn:
            return await conn.execute(sql, *args)

    @staticmethod
    async def _pk(conn: Conn, key: SessionKey) -> int:
        pk = await conn.fetchval(q.SESSION_PK, *key_args(key))
        if pk is None:
            raise SessionNotFound("session not found")
        return int(pk)

    async def _rows_of(self, key: SessionKey, sql: str, *args: Any) -> list[Row]:
        """Rows of ``sql`` (``$1`` is the session's pk); SessionNotFound without the session."""
        async with self._conn() as conn:
            return await conn.fetch(sql, await self._pk(conn, key), *args)

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
                    reset=_keep,
                ),
            )
        except DRIVER_ERRORS as exc:
            translate(exc)
        try:
            async with pool.acquire(timeout=self._timeout) as conn:
                versions = await migrate(conn)
                self.migrated = self.migrated or versions
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, DRIVER_ERRORS):
                translate(exc)
            raise
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            # Waits for connections in use to come back; a call stuck on a lock does not get
            # to hold up shutdown for longer than this.
            async with asyncio.timeout(self._timeout):
                await pool.close()
        except DRIVER_ERRORS:  # TimeoutError among them
            pool.terminate()

    async def ping(self) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await self._fetchval("SELECT 1")
        except TimeoutError as exc:  # the deadline's own, which _conn does not see
            raise StoreError(f"postgresql: no answer within {self._timeout} s") from exc
