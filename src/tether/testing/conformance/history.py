"""A session's history: the items its turns wrote, as the turn loop and the API read them.

Item seqs are the store's to assign, one per item with no gaps and never reused (a reader's
cursor must never come to point at another item); items of failed or rolled-back turns never
reach a model again, which is what ``recent_items`` and ``latest_summary`` must honour.
"""

from __future__ import annotations

import pytest

from tether.errors import SessionBusy, SessionNotFound
from tether.records import Item, ItemKind, NewItem, TurnEnding
from tether.store.protocol import Store
from tether.testing.conformance._support import call, ev, key, new_session, result, running_turn


class HistoryConformance:
    """Reading and clearing a session's items: seqs, pagination, recent items, summaries.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_item_seq_is_assigned_by_the_store_without_gaps(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [call("c1"), result("c1")], [ev(3)])
        await store.append(lease, "t1", [NewItem("assistant", "a")], [])
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(4)])
        await running_turn(store, k, "t2", lease=lease)
        await store.end_turn(
            lease,
            "t2",
            TurnEnding("completed", "answered"),
            [NewItem("assistant", "b"), NewItem("assistant", "c")],
            [ev(3)],
        )
        items = await store.list_items(k)
        assert [i.seq for i in items] == list(range(1, 8))
        assert [i.turn_id for i in items] == ["t1"] * 4 + ["t2"] * 3

    async def test_recent_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1", text="u1")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("assistant", "a1")], [ev(3)]
        )
        await running_turn(store, k, "t2", lease=lease, text="u2")
        await store.end_turn(
            lease,
            "t2",
            TurnEnding("failed", "internal_error"),
            [NewItem("assistant", "bad")],
            [ev(3)],
        )
        await running_turn(store, k, "t3", lease=lease, text="u3")
        await store.append(lease, "t3", [NewItem("assistant", "a3")], [ev(3)])
        # seqs: 1 u1, 2 a1, 3 u2 (excl), 4 bad (excl), 5 u3, 6 a3
        assert [i.seq for i in await store.recent_items(k)] == [6, 5, 2, 1]
        assert [i.seq for i in await store.recent_items(k, limit=2)] == [6, 5]
        assert [i.seq for i in await store.recent_items(k, before_seq=5, limit=2)] == [2, 1]
        assert [i.seq for i in await store.recent_items(k, before_seq=6)] == [5, 2, 1]
        assert [i.seq for i in await store.recent_items(k, before_seq=2)] == [1]
        assert await store.recent_items(k, before_seq=1) == []
        assert await store.recent_items(k, limit=0) == []
        items = {i.seq: i for i in await store.list_items(k)}
        assert await store.recent_items(k, limit=1) == [items[6]]

    async def test_list_items_pagination(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [NewItem("assistant", str(n)) for n in range(11)], [])
        everything = await store.list_items(k)
        assert [i.seq for i in everything] == list(range(1, 13))
        pages: list[Item] = []
        after = 0
        while page := await store.list_items(k, after_seq=after, limit=5):
            assert len(page) <= 5
            pages.extend(page)
            after = page[-1].seq
        assert pages == everything
        assert [i.seq for i in await store.list_items(k, after_seq=10)] == [11, 12]
        assert await store.list_items(k, after_seq=12) == []
        assert [i.seq for i in await store.list_items(k, limit=2)] == [1, 2]

    async def test_clear_items(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        with pytest.raises(SessionBusy) as running_busy:
            await store.clear_items(k)
        assert running_busy.value.busy_turn_id == "t1"
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [NewItem("summary", "s")], [ev(3)]
        )
        await store.enqueue_turn(k, turn_id="t2", input="x", policy="enqueue")
        with pytest.raises(SessionBusy) as queued_busy:
            await store.clear_items(k)
        assert queued_busy.value.busy_turn_id == "t2"
        assert len(await store.list_items(k)) == 2
        await store.end_waiting_turn(k, "t2", "cancelled")

        assert await store.clear_items(k) == 2
        assert await store.list_items(k) == []
        assert await store.recent_items(k) == []
        # The ended turns (their input and output are history too) and their events go with it.
        assert await store.list_turns(k) == []
        assert await store.list_events(k, "t1") == []
        assert await store.clear_items(k) == 0
        # Seqs are not reused, so a reader's cursor never points at a different item or turn
        # (and the clear left a gap: rules.ITEM_SEQ_GAP).
        await running_turn(store, k, "t3", lease=lease)
        (item,) = await store.list_items(k)
        assert item.seq > 3
        assert [t.seq for t in await store.list_turns(k)] == [3]

    @pytest.mark.parametrize("kind", ["summary", "handoff"])
    async def test_latest_summary_and_handoff_skip_failed_and_rolled_back_turns(
        self, store: Store, kind: ItemKind
    ) -> None:
        latest = store.latest_summary if kind == "summary" else store.latest_handoff
        k = await new_session(store)
        assert await latest(k) is None
        lease = await running_turn(store, k, "t1")
        done = TurnEnding("completed", "answered")
        await store.end_turn(lease, "t1", done, [NewItem(kind, "first")], [ev(3)])
        first = await latest(k)
        assert first is not None and (first.kind, first.content) == (kind, "first")

        await running_turn(store, k, "t2", lease=lease)
        failed = TurnEnding("failed", "model_error", error="boom")
        await store.end_turn(lease, "t2", failed, [NewItem(kind, "from a failed turn")], [])
        await running_turn(store, k, "t3", lease=lease)
        rolled = TurnEnding("rolled_back", "rollback")
        await store.end_turn(lease, "t3", rolled, [NewItem(kind, "rolled back")], [])
        assert await latest(k) == first

        await running_turn(store, k, "t4", lease=lease)
        other: ItemKind = "handoff" if kind == "summary" else "summary"
        items = [
            NewItem(kind, "newest"),
            NewItem(other, "the other kind"),
            NewItem("assistant", "x"),
        ]
        await store.end_turn(lease, "t4", done, items, [ev(3)])
        newest = await latest(k)
        assert newest is not None and (newest.kind, newest.content) == (kind, "newest")
        assert newest.seq > first.seq
        with pytest.raises(SessionNotFound):
            await latest(key("nobody"))
