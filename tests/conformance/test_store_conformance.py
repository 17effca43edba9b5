"""The store conformance suite, run against every backend this build has.

One test class per capability, so a failing test's id names the capability as well as the
backend (``TestFencing::test_recover_with_nothing_running[postgres]``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.store import InMemoryStore, PostgresStore, SQLiteStore
from tether.store.protocol import Store
from tether.testing.conformance import (
    DecisionsConformance,
    DocumentsConformance,
    EndingsConformance,
    EventsConformance,
    FencingConformance,
    ForgetConformance,
    HistoryConformance,
    IdempotencyConformance,
    LeasesConformance,
    LifecyclesConformance,
    LimitsConformance,
    RecallConformance,
    SearchConformance,
    SessionsConformance,
    TurnsConformance,
)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh, unopened store; the PostgreSQL one lives in a schema of its own."""
    if request.param == "memory":
        return InMemoryStore()
    if request.param == "sqlite":
        return SQLiteStore(tmp_path / "t.db")
    # Asked for only here, so the memory and SQLite runs never need a PostgreSQL server.
    return PostgresStore(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def store(backend: Store) -> AsyncIterator[Store]:
    """The opened store every conformance test receives (it overrides the conftest one)."""
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


class TestSessions(SessionsConformance):
    pass


class TestHistory(HistoryConformance):
    pass


class TestTurns(TurnsConformance):
    pass


class TestEndings(EndingsConformance):
    pass


class TestLeases(LeasesConformance):
    pass


class TestFencing(FencingConformance):
    pass


class TestEvents(EventsConformance):
    pass


class TestRecall(RecallConformance):
    pass


class TestSearch(SearchConformance):
    pass


class TestDocuments(DocumentsConformance):
    pass


class TestForget(ForgetConformance):
    pass


class TestLifecycles(LifecyclesConformance):
    pass


class TestLimits(LimitsConformance):
    pass


class TestIdempotency(IdempotencyConformance):
    pass


class TestDecisions(DecisionsConformance):
    pass
