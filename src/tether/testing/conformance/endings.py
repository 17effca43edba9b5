"""How a turn ends, and what each ending does to the items it wrote (DESIGN §3).

A completed turn keeps its items; a failed one keeps them but excludes them from every later
prompt; a rolled-back one deletes them; interrupted and limit endings keep a partial answer
flagged incomplete. An ended turn can be neither ended, started nor cancelled again.
"""

from __future__ import annotations

import pytest

from tether.errors import Conflict
from tether.events import TURN_ENDED
from tether.records import NewItem, TurnEnding, Usage
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    acquire,
    call,
    ev,
    new_session,
    result,
    running_turn,
    snapshot,
)


class EndingsConformance:
    """Ending a running turn: each status's effect on its items, and endings are final.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_end_turn_completed_round_trips(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        usage = Usage(input_tokens=120, output_tokens=45, model_calls=2)
        ending = TurnEnding("completed", "answered", output="42", complete=True, usage=usage)
        done = await store.end_turn(
            lease, "t1", ending, [NewItem("assistant", "42")], [ev(3, TURN_ENDED, status="x")]
        )
        assert (done.status, done.reason, done.output, done.complete, done.error) == (
            "completed",
            "answered",
            "42",
            True,
            None,
        )
        assert done.usage == usage
        assert done.ended_at is not None and done.started_at is not None
        assert done.ended_at >= done.started_at
        assert (done.id, done.key, done.seq, done.input) == ("t1", k, 1, "hello")
        assert await store.get_turn(k, "t1") == done
        assert [i.content for i in await store.list_items(k)] == ["hello", "42"]
        assert [e.seq for e in await store.list_events(k, "t1")] == [1, 2, 3]
        assert await store.active_turns(k) == []

        # An ended turn cannot be ended, started or cancelled again.
        before = await snapshot(store, k)
        with pytest.raises(Conflict):
            await store.end_turn(lease, "t1", TurnEnding("failed", "caller_cancelled"), [], [ev(4)])
        with pytest.raises(Conflict):
            await store.start_turn(lease, "t1", [], [ev(4)])
        assert await store.end_waiting_turn(k, "t1", "internal_error") is None
        assert await snapshot(store, k) == before

    async def test_end_turn_requires_a_running_turn(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(k, turn_id="t1", input="x", policy="enqueue")
        lease = await acquire(store, k)
        before = await snapshot(store, k)
        for turn_id in ("t1", "unknown"):
            with pytest.raises(Conflict):
                await store.end_turn(
                    lease,
                    turn_id,
                    TurnEnding("completed", "answered"),
                    [NewItem("assistant", "x")],
                    [ev(2)],
                )
        assert await snapshot(store, k) == before

    async def test_end_turn_failed_excludes_its_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="first")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "one")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="second")
        await store.append(lease, "t2", [call("c1"), result("c1")], [ev(3)])
        failed = await store.end_turn(
            lease,
            "t2",
            TurnEnding("failed", "model_error", error="provider returned 500"),
            [NewItem("assistant", "partial", complete=False)],
            [ev(4, TURN_ENDED)],
        )
        assert (failed.status, failed.reason, failed.error) == (
            "failed",
            "model_error",
            "provider returned 500",
        )
        assert await store.get_turn(k, "t2") == failed
        items = await store.list_items(k)
        assert [(i.turn_id, i.excluded) for i in items] == [
            ("t1", False),
            ("t1", False),
            ("t2", True),
            ("t2", True),
            ("t2", True),
            ("t2", True),
        ]
        recent = await store.recent_items(k)
        assert [i.content for i in recent] == ["one", "first"]
        # Later turns' items are not excluded.
        await running_turn(store, k, "t3", lease=lease, text="third")
        assert [i.content for i in await store.recent_items(k)] == ["third", "one", "first"]

    async def test_history_changes_without_the_lease_leave_a_gap_in_item_seqs(
        self, store: Store
    ) -> None:
        """Clearing the history and ending a waiting turn need no lease; each leaves a gap
        (rules.ITEM_SEQ_GAP) before the next item, so the lease's holder, which knows the seq
        its next write should get, sees that the history moved (a cached window is stale)."""
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="first")
        ended = await store.append(lease, "t1", [NewItem("assistant", "one")], [ev(3)])
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(4)])
        expected = ended[-1].seq + 1
        # Nothing else wrote: the next turn's first item has the seq expected.
        await running_turn(store, k, "t2", lease=lease, text="second")
        second = [i for i in await store.list_items(k) if i.turn_id == "t2"]
        assert second[0].seq == expected
        await store.end_turn(lease, "t2", TurnEnding("completed", "answered"), [], [ev(3)])
        expected += 1
        # A queued turn ended by a cancel: its ending moved the history on.
        await store.enqueue_turn(k, turn_id="t3", input="x", policy="enqueue")
        assert await store.end_waiting_turn(k, "t3", "cancelled") is not None
        await running_turn(store, k, "t4", lease=lease, text="fourth")
        fourth = [i for i in await store.list_items(k) if i.turn_id == "t4"]
        assert fourth[0].seq > expected
        await store.end_turn(lease, "t4", TurnEnding("completed", "answered"), [], [ev(3)])
        expected = fourth[0].seq + 1
        # The history cleared: the same.
        assert await store.clear_items(k) == 4
        await running_turn(store, k, "t5", lease=lease, text="fifth")
        (fifth,) = await store.list_items(k)
        assert fifth.seq > expected and fifth.content == "fifth"

    async def test_end_turn_rolled_back_deletes_its_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="first")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "one")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="second")
        await store.append(lease, "t2", [NewItem("assistant", "half", complete=False)], [ev(3)])
        rolled = await store.end_turn(
            lease,
            "t2",
            TurnEnding("rolled_back", "rollback"),
            [NewItem("assistant", "more")],
            [ev(4, TURN_ENDED)],
        )
        assert (rolled.status, rolled.reason) == ("rolled_back", "rollback")
        assert await store.get_turn(k, "t2") == rolled
        assert [e.seq for e in await store.list_events(k, "t2")] == [1, 2, 3, 4]
        assert [(i.turn_id, i.content) for i in await store.list_items(k)] == [
            ("t1", "first"),
            ("t1", "one"),
        ]
        assert [i.content for i in await store.recent_items(k)] == ["one", "first"]

    async def test_partial_and_limit_endings_round_trip(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        ending = TurnEnding(
            "interrupted", "interrupt", output="half an ans", complete=False, usage=Usage(5, 3, 1)
        )
        t1 = await store.end_turn(
            lease, "t1", ending, [NewItem("assistant", "half an ans", complete=False)], [ev(3)]
        )
        assert (t1.status, t1.reason, t1.output, t1.complete, t1.usage) == (
            "interrupted",
            "interrupt",
            "half an ans",
            False,
            Usage(5, 3, 1),
        )
        items = await store.list_items(k)
        assert (items[-1].complete, items[-1].excluded) == (False, False)
        await running_turn(store, k, "t2", lease=lease)
        t2 = await store.end_turn(
            lease, "t2", TurnEnding("limit_reached", "max_iterations"), [], [ev(3)]
        )
        assert await store.get_turn(k, "t2") == t2
        assert (t2.status, t2.reason, t2.output) == ("limit_reached", "max_iterations", None)
