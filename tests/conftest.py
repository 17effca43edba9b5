from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import StoreFactory, store_factory
from tether.models import guard
from tether.store.protocol import Store


@pytest.fixture(autouse=True)
def _forbid_real_models(request: pytest.FixtureRequest) -> Iterator[None]:
    """Any real provider call fails unless the test is marked ``real_model``."""
    allowed = request.node.get_closest_marker("real_model") is not None
    previous = guard.ALLOW_MODEL_REQUESTS
    guard.ALLOW_MODEL_REQUESTS = allowed
    try:
        yield
    finally:
        guard.ALLOW_MODEL_REQUESTS = previous


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of fresh stores, once per backend (PostgreSQL when it is configured)."""
    if request.param == "postgres":
        from tether.store.postgres import PostgresStore

        url: str = request.getfixturevalue("postgres_url")  # skips when not configured
        return lambda: PostgresStore(url)
    return store_factory(str(request.param), tmp_path)


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    return make_store()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database of its own for this test session (skips without a server)."""
    from tests.conformance.postgres_db import session_database

    yield from session_database()


@pytest.fixture
def postgres_url(postgres_database: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A PostgreSQL URL whose ``search_path`` is a fresh, empty schema of this test."""
    from tests.conformance.postgres_db import fresh_schema

    if "postgres_to_myself" in request.fixturenames:  # before the schema: it waits for the others
        request.getfixturevalue("postgres_to_myself")
    yield from fresh_schema(postgres_database)


@pytest.fixture
def postgres_to_myself() -> Iterator[None]:
    """No other test process uses the test PostgreSQL while this test runs (it restarts it)."""
    from tests.conformance.postgres_db import restart_lock

    yield from restart_lock()


def pytest_configure(config: pytest.Config) -> None:
    from tests.groups import GroupSummary

    config.pluginmanager.register(GroupSummary(), "tether-test-groups")
