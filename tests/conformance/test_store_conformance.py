"""The store conformance suite, run against every backend this build has."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.store import MemoryStore, PostgresStore, SQLiteStore
from tether.store.protocol import Store
from tether.testing.conformance import StoreConformance
from tether.testing.conformance_memory import MemoryConformance


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, unopened store; the PostgreSQL one lives in a schema of its own."""
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "t.db")
    # Asked for only here, so the memory and SQLite runs never need a PostgreSQL server.
    return PostgresStore(request.getfixturevalue("postgres_url"))


class TestStoreConformance(StoreConformance):
    @pytest.fixture
    async def store(self, backend: Store) -> AsyncIterator[Store]:
        await backend.open()
        try:
            yield backend
        finally:
            await backend.close()


class TestMemoryConformance(MemoryConformance):
    @pytest.fixture
    async def store(self, backend: Store) -> AsyncIterator[Store]:
        await backend.open()
        try:
            yield backend
        finally:
            await backend.close()
