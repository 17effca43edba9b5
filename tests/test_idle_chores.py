"""While nothing runs, the scheduler's cancel watcher sleeps until a turn starts: no timer
wakes it to find nothing to do (issue 15, "nothing runs while nothing happens")."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from tether.scheduler import chores
from tether.scheduler.local import Running, RunningTurn


class CountingRunning(Running):
    """Counts how often the watcher looks whether anything runs."""

    looks = 0

    def __len__(self) -> int:
        self.looks += 1
        return super().__len__()


class NoRequests:
    """A store with no cancel requests, counting the reads."""

    reads = 0

    async def cancel_requests(self, turn_ids: list[str]) -> dict[str, Any]:
        self.reads += 1
        return {}


async def test_the_cancel_watcher_sleeps_while_nothing_runs_and_wakes_when_a_turn_starts() -> None:
    running = CountingRunning()
    store = NoRequests()
    watcher = asyncio.create_task(
        chores.watch_cancels(store, running, 0.01)  # type: ignore[arg-type]
    )
    try:
        await asyncio.sleep(0.3)  # thirty polls' worth of doing nothing
        assert running.looks <= 3, f"woke {running.looks} times with nothing running"
        assert store.reads == 0
        running["t_1"] = RunningTurn(None, None)  # type: ignore[arg-type]
        for _ in range(500):
            if store.reads:
                break
            await asyncio.sleep(0.01)
        assert store.reads > 0, "a turn started and its cancel requests were never read"
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_started_returns_at_once_when_a_turn_already_runs() -> None:
    running = Running()
    running["t_1"] = RunningTurn(None, None)  # type: ignore[arg-type]
    await asyncio.wait_for(running.started(), 5)


class Counted(NoRequests):
    """A store shared with other processes that says when they wrote (SQLite's
    data_version), and has one cancel request for ``t_1`` once ``requested`` is set."""

    version = 0
    requested = False

    async def data_version(self) -> int:
        self.looks += 1
        return self.version

    def seen_version(self) -> int:
        return self.version

    def heard(self) -> int | None:
        return None  # nobody rings it: the watcher looks every interval

    async def hear(self, after: int) -> None:
        return None

    async def cancel_requests(self, turn_ids: list[str]) -> dict[str, Any]:
        self.reads += 1
        return {"t_1": ("cancelled", "cancelled")} if self.requested else {}

    looks = 0


class Rung(Counted):
    """The same, rung by the other processes' commits (SQLite's doorbell): ``ring()`` is a
    commit of another process."""

    def __init__(self) -> None:
        self.rings = 0
        self.rang = asyncio.Event()

    def heard(self) -> int | None:
        return self.rings

    async def hear(self, after: int) -> None:
        while self.rings <= after:
            self.rang.clear()
            await self.rang.wait()

    def ring(self) -> None:
        self.version += 1
        self.rings += 1
        self.rang.set()


class Cancellable:
    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    def request_cancel(self, status: str, reason: str) -> None:
        self.asked.append((status, reason))


async def test_a_running_turn_costs_no_reads_until_another_process_writes() -> None:
    running = Running()
    store = Counted()
    ctx = Cancellable()
    watcher = asyncio.create_task(
        chores.watch_cancels(store, running, 0.01, fallback_interval=60)  # type: ignore[arg-type]
    )
    try:
        running["t_1"] = RunningTurn(None, ctx)  # type: ignore[arg-type]
        for _ in range(500):  # the first look after a turn starts always reads
            if store.reads:
                break
            await asyncio.sleep(0.01)
        assert store.reads == 1
        await asyncio.sleep(0.2)  # twenty looks while the turn waits on its model
        assert store.reads == 1, "the requests were read with nothing written elsewhere"
        store.requested, store.version = True, 1  # another process asked for a cancel
        for _ in range(500):
            if ctx.asked:
                break
            await asyncio.sleep(0.01)
        assert ctx.asked == [("cancelled", "cancelled")]
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


class _Ctx:
    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []

    def request_cancel(self, status: str, reason: str) -> bool:
        self.cancelled.append((status, reason))
        return True


class _Turn:
    def __init__(self, key: Any) -> None:
        self.key = key


class SlowRenewal:
    """Renews nothing, and only once told to: meanwhile the test swaps the lease."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def renew_leases(self, leases: list[Any], ttl: float) -> list[Any]:
        self.asked.set()
        await self.answer.wait()
        return []


async def _one_heartbeat(swap: bool) -> list[tuple[str, str]]:
    from tether.records import Lease, SessionKey

    key = SessionKey("t", "u", "s")
    first = Lease(key, "me", 1, 0.0)
    leases: dict[Any, Lease] = {key: first}
    ctx = _Ctx()
    running = Running()
    running["t_1"] = RunningTurn(_Turn(key), ctx)  # type: ignore[arg-type]
    store = SlowRenewal()
    beat = asyncio.create_task(chores.heartbeat(store, leases, running, 0.15))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(store.asked.wait(), 5)
        if swap:
            # The worker gave the lease up and took it again for a new turn meanwhile.
            leases[key] = Lease(key, "me", 2, 0.0)
        store.answer.set()
        await asyncio.sleep(0.02)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat
    return ctx.cancelled


async def test_a_lease_given_up_and_taken_again_during_a_renewal_is_not_lost() -> None:
    """The renewal asked about the old lease; the turn running now runs under the new one, and
    must not be stopped as lease_lost (a turn on three nodes failed so, 19 ms after it began)."""
    assert await _one_heartbeat(swap=True) == []


async def test_a_lease_the_renewal_did_not_keep_stops_its_turn() -> None:
    assert await _one_heartbeat(swap=False) == [("failed", "lease_lost")]


async def test_a_running_turn_costs_not_even_a_look_until_another_process_rings() -> None:
    """With a doorbell, a turn waiting on its model costs nothing at all (it cost a look at
    the data version every 25 ms): a request from elsewhere comes with a ring, which is looked
    into at once."""
    running = Running()
    store = Rung()
    ctx = Cancellable()
    watcher = asyncio.create_task(
        chores.watch_cancels(store, running, 0.01, fallback_interval=60)  # type: ignore[arg-type]
    )
    try:
        running["t_1"] = RunningTurn(None, ctx)  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # thirty polls' worth of a turn waiting on its model
        assert (store.looks, store.reads) == (0, 0)
        store.requested = True
        store.ring()  # another process asked for a cancel
        for _ in range(500):
            if ctx.asked:
                break
            await asyncio.sleep(0.01)
        assert ctx.asked == [("cancelled", "cancelled")]
        assert (store.looks, store.reads) == (1, 1)
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def test_a_stream_of_rings_is_looked_into_no_more_often_than_the_interval() -> None:
    """Another busy process rings the store after each of its commits: a turn of ours waiting
    on its model looks at the data version at most once an interval (a few at once after a
    quiet spell), not once a ring."""
    running = Running()
    store = Rung()
    ctx = Cancellable()
    watcher = asyncio.create_task(
        chores.watch_cancels(store, running, 0.05, fallback_interval=60)  # type: ignore[arg-type]
    )
    try:
        running["t_1"] = RunningTurn(None, ctx)  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        for _ in range(100):  # 100 commits elsewhere over ~0.5 s
            store.ring()
            await asyncio.sleep(0.005)
        assert 1 <= store.looks <= 3 + 12, store.looks  # a burst, then one each 50 ms
        assert not ctx.asked
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
