"""API keys are stored hashed (DESIGN §11): the tables hold a SHA-256 of each key, never the key.

Read straight from the database (SQL, and for SQLite the files on disk, write-ahead log
included), not through the store: a store that kept the secret and hid it would pass any test
that asks the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]

from tether.keys import KEY_PREFIX, ApiKeys, NewKey
from tether.store import PostgresStore, SQLiteStore
from tether.store.protocol import Store


async def _mint(store: Store) -> list[NewKey]:
    keys = ApiKeys(store)
    made = [await keys.create("alice", "acme"), await keys.create("root", "acme", admin=True)]
    # A revoked key's secret must not be kept either.
    revoked = await keys.create("bob", "acme")
    assert await keys.revoke(revoked.record.id)
    # And each still works as a key: the hash is what authentication reads.
    for new in [*made, revoked]:
        if new is not revoked:
            assert (await keys.principal(new.secret)).user == new.record.user
    return [*made, revoked]


def _random_part(new: NewKey) -> str:
    """The secret without its public ``tk_<id>_`` prefix."""
    prefix = f"{KEY_PREFIX}{new.record.id}_"
    assert new.secret.startswith(prefix) and len(new.secret) >= len(prefix) + 24
    return new.secret.removeprefix(prefix)


def _assert_no_secret(rows: list[tuple[object, ...]], minted: list[NewKey]) -> None:
    """``rows`` are ``(id, hash, every column…)`` of the keys table."""
    assert len(rows) == len(minted)
    cells = [str(cell) for row in rows for cell in row]
    for new in minted:
        tail = _random_part(new)
        assert not any(new.secret in cell or tail in cell for cell in cells), new.record.id
    hashes = {str(row[1]) for row in rows}
    assert hashes == {hashlib.sha256(new.secret.encode()).hexdigest() for new in minted}


def _read_sqlite(path: Path) -> tuple[list[tuple[object, ...]], list[bytes]]:
    """The keys table's rows, and the bytes of the database's files (WAL and journal too)."""
    files = [p.read_bytes() for p in path.parent.iterdir() if p.name.startswith(path.name)]
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT id, hash, * FROM api_keys").fetchall()
    return rows, files


async def test_sqlite_keeps_only_hashes(tmp_path: Path) -> None:
    path = tmp_path / "tether.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        minted = await _mint(store)
        # Read while the store is open: recent writes may still be only in the WAL file.
        rows, files = await asyncio.to_thread(_read_sqlite, path)
    finally:
        await store.close()
    _assert_no_secret(rows, minted)
    for data in files:
        for new in minted:
            assert _random_part(new).encode() not in data


async def test_postgres_keeps_only_hashes(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    try:
        minted = await _mint(store)
    finally:
        await store.close()
    conn = await asyncpg.connect(postgres_url, timeout=10)
    try:
        rows = await conn.fetch("SELECT id, hash, * FROM api_keys")
    finally:
        await conn.close()
    _assert_no_secret([tuple(r) for r in rows], minted)
