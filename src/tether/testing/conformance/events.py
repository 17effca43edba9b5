"""A turn's event log and cancel requests: what a client streams, resumes and asks for.

Every event keeps its own seq, even where a backend packs streamed deltas together, so a client
can resume after any seq; a cancel request reaches only the owner's running turn, and the first
one wins.
"""

from __future__ import annotations

import pytest

from tether.errors import Conflict
from tether.events import MESSAGE_DELTA, TOOL_CALL, TOOL_RESULT, TURN_ENDED
from tether.records import TurnEnding
from tether.store.protocol import Store
from tether.testing.conformance._support import ev, key, new_session, running_turn, snapshot


class EventsConformance:
    """Listing and resuming a turn's events, and cancel requests reaching the owner.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_list_events(self, store: Store) -> None:
        k = await new_session(store)
        foreign = [key("s1", owner="mallory"), key("s1", tenant="evil"), key("missing")]
        await new_session(store, foreign[0])
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [], [ev(n, TOOL_RESULT, n=n) for n in range(3, 9)])
        events = await store.list_events(k, "t1")
        assert [e.seq for e in events] == list(range(1, 9))
        assert all(e.turn_id == "t1" for e in events)
        assert events[5].data == {"n": 6}
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=6)] == [7, 8]
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=2, limit=3)] == [3, 4, 5]
        assert await store.list_events(k, "t1", after_seq=8) == []
        assert await store.list_events(k, "unknown") == []
        for other in foreign:
            assert await store.list_events(other, "t1") == []

    async def test_streamed_deltas_replay_one_by_one(self, store: Store) -> None:
        """Backends may pack text deltas; every delta still has its own seq for resume."""
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        words = [f"w{n} " for n in range(10)]
        batch = [ev(3 + n, MESSAGE_DELTA, text=w) for n, w in enumerate(words)]
        batch.append(ev(13, TOOL_CALL, name="lookup"))
        batch += [ev(14 + n, MESSAGE_DELTA, text=f"x{n}") for n in range(3)]
        await store.append(lease, "t1", [], batch)
        await store.append(lease, "t1", [], [ev(17, MESSAGE_DELTA, text="tail")])
        events = await store.list_events(k, "t1")
        assert [e.seq for e in events] == list(range(1, 18))
        deltas = [e.data["text"] for e in events if e.type == MESSAGE_DELTA]
        assert deltas == [*words, "x0", "x1", "x2", "tail"]
        for after in (0, 4, 7, 12, 13, 15, 16):
            resumed = await store.list_events(k, "t1", after_seq=after)
            assert [e.seq for e in resumed] == list(range(after + 1, 18)), after
        assert [e.seq for e in await store.list_events(k, "t1", after_seq=5, limit=4)] == [
            6,
            7,
            8,
            9,
        ]
        before = await snapshot(store, k)
        with pytest.raises(Conflict):  # inside an earlier run of deltas
            await store.append(lease, "t1", [], [ev(8, MESSAGE_DELTA, text="again")])
        assert await snapshot(store, k) == before

    async def test_cancel_requests_reach_the_owner(self, store: Store) -> None:
        k = await new_session(store)
        other = key("s1", owner="mallory")
        await new_session(store, other)
        await store.enqueue_turn(k, turn_id="queued-only", input="x", policy="enqueue")
        assert not await store.request_cancel(k, "queued-only", "cancelled", "cancelled")
        await store.end_waiting_turn(k, "queued-only", "session_deleted")
        lease = await running_turn(store, k, "t1")
        assert await store.cancel_requests(["t1"]) == {}
        assert not await store.request_cancel(
            other, "t1", "cancelled", "client_disconnected"
        )  # not theirs
        assert await store.request_cancel(k, "t1", "interrupted", "interrupt")
        assert not await store.request_cancel(k, "t1", "cancelled", "shutdown")  # first one wins
        assert await store.cancel_requests(["t1", "unknown"]) == {
            "t1": ("interrupted", "interrupt")
        }
        assert await store.cancel_requests([]) == {}
        await store.end_turn(
            lease, "t1", TurnEnding("interrupted", "interrupt"), [], [ev(3, TURN_ENDED)]
        )
        assert not await store.request_cancel(k, "t1", "cancelled", "caller_cancelled")
