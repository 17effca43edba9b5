"""What a session owns dies with it; what a turn writes besides items commits with its ending.

DESIGN §3 and §8: session-scope memory and knowledge are deleted with their session (delete,
TTL sweep) in the same transaction, so a re-created session id starts empty; clearing a
session's history also drops the memory its turns wrote (automatic notes, the model's
``remember``); and a turn's memory writes are applied by its ending, under its lease, only when
the ending keeps the turn's items.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tether.errors import StaleLease
from tether.events import TURN_ENDED
from tether.records import EndStatus, MemoryWrites, Namespace, Reason, TurnEnding
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    acquire,
    add_doc,
    ev,
    ids,
    key,
    new_session,
    note,
    put,
    running_turn,
    vec,
    version,
)


def _writes(ns: Namespace, *record_ids: str, delete: tuple[str, ...] = ()) -> MemoryWrites:
    meta = {"author": "auto", "turn_id": "t1", "session_id": ns.session_id}
    return MemoryWrites(
        put=tuple(
            (note(ns, r, f"note {r}", kind="note", meta=meta), vec(1.0, 0.0)) for r in record_ids
        ),
        delete=tuple((ns, r) for r in delete),
    )


async def _end_with_writes(store: Store, ending: TurnEnding) -> tuple[Namespace, str, int]:
    """End a running turn that noted ``m-new`` in place of the older ``m-old``: the session's
    namespace, the old record's id and the namespace's version before the ending."""
    k = await new_session(store)
    ns = Namespace.session(k)
    old = await put(store, ns, "m-old", "My name is Alice", meta={"author": "auto"})
    lease = await running_turn(store, k, "t1")
    before = await version(store, ns)
    writes = _writes(ns, "m-new", delete=(old.id,))
    await store.end_turn(lease, "t1", ending, [], [ev(3, TURN_ENDED)], memory=writes)
    return ns, old.id, before


class LifecyclesConformance:
    """Session-owned memory follows its session; a turn's memory follows its ending.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_delete_session_deletes_its_memory_and_knowledge(self, store: Store) -> None:
        mine, other = key("s1"), key("s1", owner="bob")
        for k in (mine, other, key("s2")):
            await new_session(store, k)
        ns = Namespace.session(mine)
        await put(store, ns, "m-session", "Alice's session note")
        await add_doc(store, ns, "d-session", collection="docs")
        kept = [
            await put(store, Namespace.user("acme", "alice"), "m-user", "Alice's user note"),
            await put(store, Namespace.session(other), "m-bob", "Bob's session note"),
            await put(store, Namespace.session(key("s2")), "m-s2", "Alice's other session"),
        ]
        assert await store.delete_session(mine) is True

        assert await ids(store, [ns]) == []
        assert await ids(store, [ns], collection="docs") == []
        assert await store.list_documents(ns, collection="docs") == []
        assert await store.get_memory(ns, "m-session") is None
        assert await version(store, ns) == 0 and await version(store, ns, "docs") == 0
        for record in kept:
            assert await store.get_memory(record.namespace, record.id) == record
        # The same id again is a new conversation: it recalls nothing of the old one.
        await new_session(store, mine)
        assert await ids(store, [ns]) == []
        found = await store.lexical_search([ns], collection="", terms=["alice", "note"], limit=5)
        assert found == []

    async def test_the_ttl_sweep_deletes_the_memory_of_what_it_sweeps(self, store: Store) -> None:
        doomed, fresh = key("sweep-doomed"), key("sweep-fresh")
        await store.create_session(doomed, "assistant", ttl_seconds=0.05)
        await store.create_session(fresh, "assistant", ttl_seconds=3600)
        await put(store, Namespace.session(doomed), "m-doomed", "goes with its session")
        survivor = await put(store, Namespace.session(fresh), "m-fresh", "stays")
        await asyncio.sleep(0.1)
        assert len(await store.sweep_expired(time.time())) == 1
        assert await ids(store, [Namespace.session(doomed)]) == []
        assert await store.get_memory(survivor.namespace, "m-fresh") == survivor

    async def test_clear_items_drops_the_memory_its_turns_wrote(self, store: Store) -> None:
        k = await new_session(store)
        ns = Namespace.session(k)
        await put(store, ns, "m-auto", "an automatic note", meta={"author": "auto"})
        await put(store, ns, "m-model", "the model remembered", meta={"author": "model"})
        by_hand = await put(
            store, ns, "m-alice", "written through the API", meta={"author": "alice"}
        )
        user_note = await put(
            store, Namespace.user("acme", "alice"), "m-user", "user scope", meta={"author": "auto"}
        )
        _, chunks = await add_doc(store, ns, "d1", collection="docs")
        lease = await running_turn(store, k, "t1", text="My name is Alice")
        await store.end_turn(
            lease, "t1", TurnEnding("completed", "answered"), [], [ev(3, TURN_ENDED)]
        )
        await store.clear_items(k)
        # The turns' own words go too: their records and events held the cleared text.
        assert await store.list_turns(k) == []
        assert await store.list_events(k, "t1") == []
        assert await store.list_items(k) == []
        assert await ids(store, [ns]) == [by_hand.id]
        assert await store.get_memory(user_note.namespace, user_note.id) == user_note
        assert await ids(store, [ns], collection="docs") == [c.id for c in chunks]

    @pytest.mark.parametrize(
        ("status", "reason"),
        [
            ("completed", "answered"),
            ("cancelled", "cancelled"),
            ("interrupted", "interrupt"),
            ("limit_reached", "max_iterations"),
        ],
    )
    async def test_an_ending_that_keeps_items_commits_the_turns_memory(
        self, store: Store, status: EndStatus, reason: Reason
    ) -> None:
        ns, _, before = await _end_with_writes(store, TurnEnding(status, reason))
        assert await ids(store, [ns]) == ["m-new"]
        assert await version(store, ns) > before

    @pytest.mark.parametrize(
        ("status", "reason"), [("failed", "model_error"), ("rolled_back", "rollback")]
    )
    async def test_an_ending_that_drops_items_drops_the_turns_memory(
        self, store: Store, status: EndStatus, reason: Reason
    ) -> None:
        ns, old_id, before = await _end_with_writes(store, TurnEnding(status, reason))
        assert await ids(store, [ns]) == [old_id]
        assert await version(store, ns) == before

    async def test_a_stale_ending_writes_no_memory(self, store: Store) -> None:
        k = await new_session(store)
        ns = Namespace.session(k)
        lease = await running_turn(store, k, "t1", ttl=0.05)
        await asyncio.sleep(0.15)
        await acquire(store, k, owner="node-b")  # another process took the session over
        with pytest.raises(StaleLease):
            await store.end_turn(
                lease,
                "t1",
                TurnEnding("completed", "answered"),
                [],
                [ev(3, TURN_ENDED)],
                memory=_writes(ns, "m-new"),
            )
        assert await ids(store, [ns]) == []
