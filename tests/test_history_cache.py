"""The history a lease's holder knows (scheduler/history.py): windows without a read per turn,
and never a window the store would not give.

Each test compares what the model was shown with what the store holds, so a cache that kept
something the store dropped (a cleared history, a rolled-back turn) or missed something written
elsewhere (an aborted call's result) fails here.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.helpers import StoreFactory
from tether import Agent
from tether.models.base import ModelRequest
from tether.records import Item, NewItem, SessionKey, TurnEnding
from tether.runtime import Runtime
from tether.scheduler.history import MAX_ITEMS, CachedHistory, HistoryCache
from tether.store import InMemoryStore
from tether.store.capabilities import ChangeCounter, ReleasingEnd
from tether.store.protocol import Store
from tether.testing import ScriptedModel


def _counting(store: Store, *more: str) -> Counter[str]:
    calls: Counter[str] = Counter()
    for name in ("recent_items", "latest_summary", *more):
        fn = getattr(store, name)

        def counted(
            *args: Any, _fn: Callable[..., Awaitable[Any]] = fn, _n: str = name, **kw: Any
        ) -> Awaitable[Any]:
            calls[_n] += 1
            return _fn(*args, **kw)

        setattr(store, name, counted)
    return calls


def _same(item: Item) -> Item:
    # An ending's own items are known with this process's clock (the store does not return
    # them); nothing that reads a window looks at created_at.
    return replace(item, created_at=0.0)


def _shown(request: ModelRequest) -> list[str]:
    return [m.content for m in request.messages if m.role in ("user", "assistant")]


async def test_a_lingering_lease_reads_the_history_once_and_shows_what_the_store_holds(
    make_store: StoreFactory,
) -> None:
    model = ScriptedModel(default="fine")
    agent = Agent(name="a", model=model)
    store = make_store()
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "cached")
        await rt.sessions.create(key, "a")
        calls = _counting(store)
        for n in range(30):
            turn = await rt.scheduler.submit(key, f"question {n}")
            await rt.scheduler.wait(key, turn.id)
        # One read on the lease's first turn (its window reaches past the known items); none
        # on the 29 turns after it.
        assert calls["recent_items"] <= 2
        assert calls["latest_summary"] <= 1
        stored = [i.content for i in await store.list_items(key, limit=1000)]
        # The last prompt is the whole stored history before its own input, in order.
        assert _shown(model.requests[-1]) == stored[:-1]


async def test_a_history_cleared_by_another_process_is_not_shown(
    make_store: StoreFactory,
) -> None:
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    model = ScriptedModel(default="noted")
    agent = Agent(name="a", model=model)
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "cleared-elsewhere")
        await a.sessions.create(key, "a")
        for text in ("my secret is 42", "remember it"):
            turn = await a.scheduler.submit(key, text)
            await a.scheduler.wait(key, turn.id)
        assert a.scheduler.lease_of(key) is not None  # A lingers, knowing the history
        assert await b.store.clear_items(key) == 4  # no lease needed: the session is idle
        turn = await a.scheduler.submit(key, "what was my secret?")
        done = await a.scheduler.wait(key, turn.id)
        assert done.status == "completed"
        assert _shown(model.requests[-1]) == ["what was my secret?"]


async def test_a_waiting_turn_ended_elsewhere_starts_the_cache_over(
    make_store: StoreFactory,
) -> None:
    """Another process ends a waiting turn of the session without the lease: its gap in the
    seqs makes the lingering holder's next write start past the seq it expected, so it reads
    the history again, and the model sees what the store holds."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    model = ScriptedModel(default="ok")
    agent = Agent(name="a", model=model)
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = 60.0
        key = SessionKey("local", "local", "moved-elsewhere")
        await a.sessions.create(key, "a")
        first = await a.scheduler.submit(key, "one")
        await a.scheduler.wait(key, first.id)
        queued = await b.store.enqueue_turn(key, turn_id="t_b", input="two", policy="enqueue")
        cancelled = await b.store.end_waiting_turn(key, queued.id, "cancelled") is not None
        if not cancelled:
            await a.scheduler.wait(key, queued.id)  # A's lingering worker took it first
        calls = _counting(a.store)
        second = await a.scheduler.submit(key, "three")
        await a.scheduler.wait(key, second.id)
        if cancelled:
            assert calls["recent_items"] >= 1  # read again, not served from what A knew
        stored = [i.content for i in await a.store.list_items(key, limit=100)]
        assert _shown(model.requests[-1]) == stored[:-1]


async def test_a_rolled_back_or_failed_turn_leaves_the_cached_window_as_the_store_has_it() -> None:
    store = InMemoryStore()
    await store.open()
    key = SessionKey("t", "u", "s")
    await store.create_session(key, "a")
    cache = HistoryCache()
    await store.enqueue_turn(key, turn_id="t1", input="one", policy="enqueue")
    lease = await store.acquire_lease(key, "me", 30)
    assert lease is not None
    for n, status in enumerate(("completed", "rolled_back", "failed", "completed")):
        turn_id = f"t{n + 1}"
        if n:
            await store.enqueue_turn(key, turn_id=turn_id, input=f"in {n}", policy="enqueue")
        cache.wrote(lease, await store.start_turn(lease, turn_id, [NewItem("user", "u")], []))
        said = [NewItem("assistant", f"reply {n}")]
        ended = await store.end_turn(lease, turn_id, TurnEnding(status, "answered"), said, [])  # type: ignore[arg-type]
        cache.ended(lease, turn_id, said, ended.status)
        history = CachedHistory(store, cache, lease)
        for before, limit in ((None, 1), (None, 3), (None, 100), (3, 2)):
            cached = await history.recent(before, limit)
            stored = await store.recent_items(key, before_seq=before, limit=limit)
            assert [_same(i) for i in cached] == [_same(i) for i in stored]


async def test_the_cache_keeps_the_newest_items_only() -> None:
    cache = HistoryCache()
    store = InMemoryStore()
    await store.open()
    key = SessionKey("t", "u", "long")
    await store.create_session(key, "a")
    await store.enqueue_turn(key, turn_id="t1", input="x", policy="enqueue")
    lease = await store.acquire_lease(key, "me", 30)
    assert lease is not None
    cache.wrote(lease, await store.start_turn(lease, "t1", [NewItem("user", "x")], []))
    for _ in range(3):
        batch = [NewItem("assistant", str(n)) for n in range(MAX_ITEMS // 2)]
        cache.wrote(lease, await store.append(lease, "t1", batch, []))
    known = cache.of(lease)
    assert known is not None and len(known.items) == MAX_ITEMS
    history = CachedHistory(store, cache, lease)
    # Past the kept ones, the store answers (and what comes back is whole).
    cached = await history.recent(None, MAX_ITEMS + 10)
    assert cached == await store.recent_items(key, limit=MAX_ITEMS + 10)


async def test_a_lingering_lease_measures_each_item_once(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease's turns share one window memo: over 30 turns each history item is sized once,
    not once per turn that shows it (which grows with the square of the session's length)."""
    from tether.loop import window

    measured: Counter[int] = Counter()
    real = window.item_tokens

    def counting(item: Item) -> int:
        measured[item.seq] += 1
        return real(item)

    monkeypatch.setattr(window, "item_tokens", counting)
    model = ScriptedModel(default="fine")
    agent = Agent(name="a", model=model)
    async with Runtime(make_store(), agents=[agent]) as rt:
        rt.scheduler.linger = 60.0
        key = SessionKey("local", "local", "measured")
        await rt.sessions.create(key, "a")
        for n in range(30):
            turn = await rt.scheduler.submit(key, f"question {n}")
            await rt.scheduler.wait(key, turn.id)
        assert len(measured) == 58  # every item before the last turn's own input
        assert set(measured.values()) == {1}
        assert _shown(model.requests[-1])[:2] == ["question 0", "fine"]


async def test_turns_further_apart_than_the_linger_read_the_history_once(
    make_store: StoreFactory,
) -> None:
    """Without a linger every turn takes a new lease; what the last lease knew of the history
    is taken up by the next while nobody touched it in between (its token one past, the seq
    it expected next): one read in all, where it was one a turn. And a store that tells each
    lease its queue (SQLite) spares the read of the queue after the lease's turn."""
    model = ScriptedModel(default="fine")
    agent = Agent(name="a", model=model)
    store = make_store()
    async with Runtime(store, agents=[agent]) as rt:
        rt.scheduler.linger = 0.0
        key = SessionKey("local", "local", "apart")
        await rt.sessions.create(key, "a")
        releasing = isinstance(store, ReleasingEnd)
        ending = "end_turn_released" if releasing else "end_turn"
        calls = _counting(store, "release_lease", "active_turns", ending)
        for n in range(10):
            turn = await rt.scheduler.submit(key, f"question {n}")
            await rt.scheduler.wait(key, turn.id)
            while rt.scheduler.lease_of(key) is not None:  # noqa: ASYNC110 - given up at once
                await asyncio.sleep(0.001)
            if releasing:
                assert await store.lease_holder(key) is None  # given up with the ending
        # A lease a turn: given up with the turn's ending by a store that can, else after it.
        assert (calls[ending], calls["release_lease"]) == (10, 0 if releasing else 10)
        assert calls["recent_items"] <= 1
        if isinstance(store, ChangeCounter):
            # The store told each lease its queue (the turn it was handed, and nothing else),
            # and says when another process wrote (none did): so no lease read the queue after
            # its turn. It was a read a turn.
            assert calls["active_turns"] == 0
        stored = [i.content for i in await store.list_items(key, limit=1000)]
        assert _shown(model.requests[-1]) == stored[:-1]


async def test_a_history_moved_between_two_leases_is_read_again(
    make_store: StoreFactory,
) -> None:
    """Between two leases of A's: B runs a turn (another lease came between), B clears the
    history (no lease, a gap in the seqs), B ends a waiting turn. Each time A's next lease
    reads the history again and shows what the store holds."""
    if make_store is InMemoryStore:
        pytest.skip("the in-memory store is one process's memory; it cannot be shared")
    model = ScriptedModel(default="ok")
    agent = Agent(name="a", model=model)
    a, b = Runtime(make_store(), agents=[agent]), Runtime(make_store(), agents=[agent])
    async with a, b:
        a.scheduler.linger = b.scheduler.linger = 0.0
        key = SessionKey("local", "local", "moved-between")
        await a.sessions.create(key, "a")

        async def on(rt: Runtime, text: str) -> None:
            turn = await rt.scheduler.submit(key, text)
            assert (await rt.scheduler.wait(key, turn.id)).status == "completed"
            # Given up before the next: otherwise the holder may run the other's turn itself
            # (and then knows the history it wrote).
            while rt.scheduler.lease_of(key) is not None:  # noqa: ASYNC110 - given up at once
                await asyncio.sleep(0.001)

        async def queued_then_ended() -> None:
            turn = await b.store.enqueue_turn(key, turn_id="t_x", input="x", policy="enqueue")
            assert await b.store.end_waiting_turn(key, turn.id, "cancelled") is not None

        async def cleared() -> None:
            await b.store.clear_items(key)

        async def by_b() -> None:
            await on(b, "from b")

        for between in (by_b, cleared, queued_then_ended):
            await on(a, f"before {between.__name__}")
            await between()
            calls = _counting(a.store)
            await on(a, f"after {between.__name__}")
            assert calls["recent_items"] >= 1, between.__name__
            stored = [i.content for i in await a.store.list_items(key, limit=100)]
            assert _shown(model.requests[-1]) == stored[:-1], between.__name__


def _hi() -> Item:
    return Item(1, "t1", "user", "hi", True, None, None, None, {}, 0.0)


def test_what_a_given_up_lease_knew_is_taken_up_only_by_the_next_lease_on_the_same_history() -> (
    None
):
    from tether.records import Lease

    key = SessionKey("t", "u", "s")
    cache = HistoryCache()
    first = Lease(key, "me", 10, 0.0)
    cache.wrote(first, [_hi()])
    cache.release(first)
    assert cache.of(first) is None
    # Another lease came between (token 12, not 11): start afresh.
    assert not cache.adopt(Lease(key, "me", 12, 0.0, history_seq=2))
    cache.wrote(first, [_hi()])
    cache.release(first)
    # The history moved without a lease (its next seq is past the one expected).
    assert not cache.adopt(Lease(key, "me", 11, 0.0, history_seq=3))
    cache.wrote(first, [_hi()])
    cache.release(first)
    # A store that does not tell.
    assert not cache.adopt(Lease(key, "me", 11, 0.0))
    cache.wrote(first, [_hi()])
    cache.release(first)
    second = Lease(key, "me", 11, 0.0, history_seq=2)
    assert cache.adopt(second)
    known = cache.of(second)
    assert known is not None and [i.content for i in known.items] == ["hi"]
