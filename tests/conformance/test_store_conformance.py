"""The store conformance suite, run against every backend this build has."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.store import MemoryStore, SQLiteStore
from tether.store.base import Store
from tether.testing.conformance import StoreConformance


class TestStoreConformance(StoreConformance):
    @pytest.fixture(params=["memory", "sqlite"])
    async def store(self, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
        backend: Store = (
            MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
        )
        await backend.open()
        try:
            yield backend
        finally:
            await backend.close()
