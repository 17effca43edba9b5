"""Shared test helpers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from tether.agent import Agent
from tether.records import LOCAL_PRINCIPAL, Item, Principal, SessionKey
from tether.runtime import Runtime
from tether.store import InMemoryStore, SQLiteStore
from tether.store.protocol import Store

StoreFactory = Callable[[], Store]


def store_factory(kind: str, tmp_path: Path) -> StoreFactory:
    if kind == "memory":
        return InMemoryStore
    return lambda: SQLiteStore(tmp_path / "tether.db")


@asynccontextmanager
async def running(store: Store, *agents: Agent, lease_ttl: float = 30.0) -> AsyncIterator[Runtime]:
    rt = Runtime(store, agents=list(agents), lease_ttl=lease_ttl)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close(drain_timeout=5)


def key(session_id: str, principal: Principal = LOCAL_PRINCIPAL) -> SessionKey:
    return SessionKey(principal.tenant, principal.user, session_id)


async def all_items(rt: Runtime, k: SessionKey) -> list[Item]:
    return await rt.store.list_items(k, limit=100_000)


def assert_paired(items: list[Item]) -> None:
    """Every tool call has exactly one result and every result has its call."""
    calls = [i.call_id or "" for i in items if i.kind == "tool_call"]
    results = [i.call_id or "" for i in items if i.kind == "tool_result"]
    assert len(calls) == len(set(calls)), f"duplicate calls: {calls}"
    assert sorted(calls) == sorted(results), f"calls {calls} vs results {results}"


async def wait_until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` (which may read state other threads change) until it holds."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 - the state polled has no event to wait on
            await asyncio.sleep(0.01)
