"""Throwaway PostgreSQL databases and schemas for the tests.

``TETHER_TEST_POSTGRES_URL`` names a server and a database to start from. A test session
creates its own database next to it, ``<that database>_t<random>``, dropped at the end, and
every test gets a fresh schema in it, selected through the URL's ``search_path``, so no table
of one test is seen by another. Without the variable, or when the server does not answer, the
PostgreSQL tests skip.

The set-up runs on a thread of its own with its own event loop: the fixtures are synchronous,
so they work from any fixture or test whatever loop pytest-asyncio gives it.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg  # type: ignore[import-untyped]
import pytest

T = TypeVar("T")

ENV = "TETHER_TEST_POSTGRES_URL"
SKIP_MESSAGE = (
    "PostgreSQL tests skipped: set TETHER_TEST_POSTGRES_URL=postgresql://user@127.0.0.1:5432/db"
    " to run them"
)
_UNREACHABLE = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn()`` to completion on a fresh event loop in another thread."""

    async def main() -> T:
        return await fn()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def with_search_path(url: str, schema: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"]
    query.append(("search_path", schema))
    return urlunsplit(parts._replace(query=urlencode(query)))


def redacted(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5432}{parts.path}"


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url, timeout=5)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def _create_database(url: str, name: str) -> bool:
    """Create ``name`` on the server of ``url``; False when this role may not create one.

    Its default collation is ICU's English one where the server has ICU, so that sorting by
    bytes (as SQLite and the memory store do) is something the store must ask for: in that
    locale ``"a_b" < "a.b"`` and ``"a" < "B"``, unlike in byte order.
    """
    icu = "TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
    try:
        try:
            await _execute(url, f'CREATE DATABASE "{name}" {icu}')
        except asyncpg.InsufficientPrivilegeError:
            raise
        except (asyncpg.SyntaxOrAccessError, asyncpg.FeatureNotSupportedError):
            await _execute(url, f'CREATE DATABASE "{name}"')  # before PostgreSQL 15, or no ICU
    except asyncpg.InsufficientPrivilegeError:
        return False
    return True


_restarting = False  # this process holds the cluster to itself (restart_lock)


@contextmanager
def _cluster_lock(url: str, mode: int) -> Iterator[None]:
    # One file per server, in the machine's temporary directory: every test process on this
    # machine (make test's workers, and a make test a test runs) takes the same lock.
    parts = urlsplit(url)
    path = Path(tempfile.gettempdir()) / f"tether-tests-pg-{parts.hostname}-{parts.port or 5432}"
    with path.open("a") as file:
        fcntl.flock(file, mode)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@contextmanager
def in_use() -> Iterator[None]:
    """Hold off a restart of the test server (restart_lock) while a test uses it.

    ``make test`` runs tests in several processes, and one test restarts PostgreSQL: while it
    runs, the other processes' PostgreSQL tests wait for it rather than fail.
    """
    url = os.environ.get(ENV, "").strip()
    if not url or _restarting:
        yield
        return
    with _cluster_lock(url, fcntl.LOCK_SH):
        yield


def restart_lock() -> Iterator[None]:
    """Have the test server to this process: no other test process uses it until the end."""
    global _restarting
    with _cluster_lock(os.environ.get(ENV, "").strip(), fcntl.LOCK_EX):
        _restarting = True
        try:
            yield
        finally:
            _restarting = False


def session_database() -> Iterator[str]:
    """Yield the URL of a database for this test session; skip without a server."""
    url = os.environ.get(ENV, "").strip()
    if not url:
        pytest.skip(SKIP_MESSAGE)
    # Named after the given database, so whoever made that one (CI: .ci/run) can also drop
    # this one by prefix should the session die before its own clean-up.
    base = urlsplit(url).path.lstrip("/") or "tether"
    name = f"{base[:40]}_t{secrets.token_hex(6)}"
    try:
        with in_use():
            own = run(lambda: _create_database(url, name))
    except _UNREACHABLE as exc:
        pytest.skip(f"{SKIP_MESSAGE} ({redacted(url)}: {exc.__class__.__name__}: {exc})")
    if not own:  # no CREATEDB privilege: fall back to the given database, one schema per test
        yield url
        return
    try:
        yield with_database(url, name)
    finally:
        with in_use():
            run(lambda: _execute(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def fresh_schema(database_url: str) -> Iterator[str]:
    """Yield a URL whose ``search_path`` is a new, empty schema; drop the schema afterwards."""
    schema = f"t_{secrets.token_hex(8)}"
    with in_use():
        run(lambda: _execute(database_url, f'CREATE SCHEMA "{schema}"'))
        try:
            yield with_search_path(database_url, schema)
        finally:
            run(lambda: _execute(database_url, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
