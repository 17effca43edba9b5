"""The session service's rules, on every backend: cancel before delete, expired ids start afresh."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import running, wait_until
from tether import Agent, SessionBusy
from tether.records import SessionKey
from tether.scheduler.sessions import SessionService, StoreCanceller
from tether.store.protocol import Store
from tether.testing import ScriptedModel, Slow

KEY = SessionKey("local", "local", "svc")


async def test_offline_cancel_ends_queued_turns_at_once(store: Store) -> None:
    await store.open()
    try:
        await store.create_session(KEY, "a")
        turns = [
            await store.enqueue_turn(KEY, turn_id=f"t{n}", input="x", policy="enqueue")
            for n in range(2)
        ]
        await SessionService(store, StoreCanceller(store)).cancel_active(KEY, "session_deleted")
        for turn in turns:
            ended = await store.get_turn(KEY, turn.id)
            assert ended is not None
            assert (ended.status, ended.reason) == ("cancelled", "session_deleted")
        assert await store.active_turns(KEY) == []
    finally:
        await store.close()


async def test_offline_cancel_waits_for_the_process_running_the_turn(store: Store) -> None:
    # A runtime runs the turn; a second service on the same store (the CLI's, no scheduler)
    # asks for the cancel through the store and returns only once the turn has ended.
    agent = Agent(name="a", model=ScriptedModel(default=Slow("w " * 200, delay=0.02, forever=True)))
    async with running(store, agent) as rt:
        await store.create_session(KEY, "a")
        turn = await rt.scheduler.submit(KEY, "long")
        await wait_until(lambda: bool(rt.scheduler.running_turns()))
        offline = SessionService(store, StoreCanceller(store))
        async with asyncio.timeout(10):
            await offline.cancel_active(KEY, "session_deleted")
        ended = await store.get_turn(KEY, turn.id)
        assert ended is not None
        assert (ended.status, ended.reason) == ("cancelled", "session_deleted")
        assert await offline.delete(KEY)
        assert await store.get_session(KEY) is None


async def test_offline_cancel_does_not_wait_for_a_turn_nobody_runs(store: Store) -> None:
    # Its owner died: the lease has expired, so nothing can write for the turn any more.
    await store.open()
    try:
        await store.create_session(KEY, "a")
        await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        lease = await store.acquire_lease(KEY, "dead-node", 0.05)
        assert lease is not None
        await store.start_turn(lease, "t1", [], [])
        await asyncio.sleep(0.15)
        service = SessionService(store, StoreCanceller(store, wait=30))
        async with asyncio.timeout(5):
            assert await service.delete(KEY)
        assert await store.get_session(KEY) is None
    finally:
        await store.close()


async def test_replace_expired_starts_the_id_afresh(store: Store) -> None:
    await store.open()
    try:
        service = SessionService(store, StoreCanceller(store))
        _, created = await service.create(KEY, "a", ttl_seconds=0.01, metadata={"v": 1})
        assert created
        await asyncio.sleep(0.05)
        kept, created = await service.create(KEY, "a", exist_ok=True)
        assert not created and kept.metadata == {"v": 1}  # embedded use: returned as it is
        fresh, created = await service.create(KEY, "a", exist_ok=True, replace_expired=True)
        assert created and fresh.metadata == {} and fresh.expires_at is None
    finally:
        await store.close()


async def test_offline_cancel_gives_up_clearly_when_the_owner_does_not_end_the_turn(
    store: Store,
) -> None:
    # A live lease holder that never acts on the request (a frozen process): the delete is
    # refused with a SessionBusy naming the turn, and nothing is deleted.
    await store.open()
    try:
        await store.create_session(KEY, "a")
        await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        lease = await store.acquire_lease(KEY, "frozen-node", 30)
        assert lease is not None
        await store.start_turn(lease, "t1", [], [])
        service = SessionService(store, StoreCanceller(store, wait=0.2))
        with pytest.raises(SessionBusy) as refused:
            await service.delete(KEY)
        assert refused.value.busy_turn_id == "t1"
        assert await store.get_session(KEY) is not None
    finally:
        await store.close()
