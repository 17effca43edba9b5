"""Memory records: the :class:`~tether.store.protocol.RecallStore` half of a store.

Put, read, list, compare-and-set updates and deletes of memory records. Most of it is about
isolation: every test that writes to one user's namespace also checks that another user (same
ids, same session id) and the same user id in another tenant see nothing of it and can change
nothing of it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import CHUNK, MemoryRecord
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    ALICE,
    ALICE_ELSEWHERE,
    ALICE_S1,
    ALICE_S2,
    BOB,
    BOB_S1,
    FOREIGN,
    TENANT,
    add_doc,
    ids,
    note,
    put,
    vec,
    version,
)


class RecallConformance:
    """Memory records by namespace: round trips, cursors, compare-and-set, deletes, isolation.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_put_and_get_round_trip(self, store: Store) -> None:
        meta = {"turn_id": "t1", "author": "model", "session_id": "s1", "nested": {"x": [1, 2]}}
        record = note(ALICE, "m1", "Alice likes green tea", kind="preference", meta=meta)
        stored = await store.put_memory(record, vec(0.5, -1.0))
        assert stored.seq > 0
        assert stored == replace(record, seq=stored.seq)
        assert await store.get_memory(ALICE, "m1") == stored
        assert await store.find_memory([BOB, ALICE], "m1") == stored
        assert await store.locate_memory("m1") == ALICE
        assert await store.list_memory([ALICE]) == [stored]

    async def test_put_with_an_existing_id_is_conflict(self, store: Store) -> None:
        first = await put(store, ALICE, "m1", "mine")
        before = (await version(store, ALICE), await version(store, BOB))
        for ns in (ALICE, BOB):  # ids are unique across namespaces, not per namespace
            with pytest.raises(Conflict):
                await store.put_memory(note(ns, "m1", "another"), vec(0.0))
        assert await store.get_memory(ALICE, "m1") == first
        assert await store.get_memory(BOB, "m1") is None
        assert await store.list_memory([ALICE, BOB]) == [first]
        assert (await version(store, ALICE), await version(store, BOB)) == before

    async def test_seqs_grow_and_are_never_reused(self, store: Store) -> None:
        a = await put(store, ALICE, "m1")
        b = await put(store, BOB, "m2")
        assert b.seq > a.seq
        assert await store.delete_memory(BOB, "m2") is True
        c = await put(store, ALICE, "m3")
        # A cursor or a search result naming the deleted m2 must never come to name m3.
        assert c.seq > b.seq
        assert await store.memory_by_seq([ALICE, BOB], [b.seq]) == []

    async def test_list_memory_oldest_first_with_a_cursor(self, store: Store) -> None:
        notes = [await put(store, ALICE, f"m{n}", f"note {n}") for n in range(7)]
        await put(store, ALICE, "c1", "a chunk", collection="docs", kind=CHUNK)
        await put(store, BOB, "b1", "bob's")
        assert await store.list_memory([ALICE]) == notes
        pages: list[list[MemoryRecord]] = []
        after = 0
        while page := await store.list_memory([ALICE], after_seq=after, limit=3):
            pages.append(page)
            after = page[-1].seq
        assert [len(p) for p in pages] == [3, 3, 1]
        assert [r for p in pages for r in p] == notes
        assert await ids(store, [ALICE], "docs") == ["c1"]
        assert await store.list_memory([ALICE], collection="other") == []
        assert await store.list_memory([ALICE], limit=0) == []
        assert await store.list_memory([]) == []

    async def test_list_memory_merges_namespaces_in_seq_order(self, store: Store) -> None:
        await put(store, TENANT, "t1")
        await put(store, ALICE, "a1")
        await put(store, ALICE_S1, "s1")
        await put(store, TENANT, "t2")
        await put(store, ALICE, "a2")
        assert await ids(store, [ALICE, TENANT]) == ["t1", "a1", "t2", "a2"]
        assert await ids(store, [ALICE_S1, ALICE, TENANT, ALICE]) == ["t1", "a1", "s1", "t2", "a2"]
        assert await ids(store, [ALICE_S2]) == []

    async def test_memory_by_seq_leaves_out_other_namespaces(self, store: Store) -> None:
        a1 = await put(store, ALICE, "a1")
        a2 = await put(store, ALICE, "a2")
        b1 = await put(store, BOB, "b1")
        missing = b1.seq + 1000
        found = await store.memory_by_seq([ALICE], [a2.seq, b1.seq, a1.seq, missing, a2.seq])
        assert found == [a2, a1]  # in the order asked, each once
        assert await store.memory_by_seq([BOB], [a1.seq, a2.seq]) == []
        assert await store.memory_by_seq([ALICE, BOB], [b1.seq]) == [b1]
        assert await store.memory_by_seq([ALICE], []) == []
        assert await store.memory_by_seq([], [a1.seq]) == []

    async def test_find_memory_looks_only_in_the_given_namespaces(self, store: Store) -> None:
        stored = await put(store, ALICE_S1, "m1")
        assert await store.find_memory([ALICE], "m1") is None
        assert await store.find_memory([ALICE_S2, ALICE, TENANT], "m1") is None
        assert await store.find_memory([BOB_S1], "m1") is None
        assert await store.find_memory([ALICE, ALICE_S1], "m1") == stored
        assert await store.find_memory([], "m1") is None
        assert await store.locate_memory("m1") == ALICE_S1

    async def test_missing_records(self, store: Store) -> None:
        assert await store.get_memory(ALICE, "nope") is None
        assert await store.find_memory([ALICE, BOB], "nope") is None
        assert await store.locate_memory("nope") is None
        assert await store.delete_memory(ALICE, "nope") is False
        with pytest.raises(MemoryNotFound):
            await store.update_memory(
                ALICE,
                "nope",
                content="x",
                kind="fact",
                embedding=vec(1.0),
                expected_revision=1,
                now=1.0,
            )
        assert await store.list_memory([ALICE]) == []

    async def test_namespace_isolation(self, store: Store) -> None:
        untouched = [BOB, ALICE_ELSEWHERE]
        versions = [await version(store, ns) for ns in untouched]
        t1 = {"turn_id": "t1", "author": "model"}
        mine = [
            await put(store, ALICE, "a-user", "secret plan zebra"),
            await put(store, ALICE_S1, "a-sess", "zebra notes", meta=t1),
        ]
        doc, chunks = await add_doc(store, ALICE, "d1")
        # The other user writes under the same session id and turn id.
        bobs = await put(store, BOB_S1, "b-sess", "zebra", meta=t1)
        seqs = [r.seq for r in mine + chunks]

        for ns in FOREIGN:
            assert await store.get_memory(ns, "a-user") is None
            assert await store.find_memory([ns], "a-sess") is None
            assert await store.memory_by_seq([ns], seqs) == []
            assert await store.lexical_search([ns], collection="", terms=["plan"], limit=10) == []
            assert (
                await store.lexical_search([ns], collection="docs", terms=["part"], limit=9) == []
            )
            assert (await store.load_vectors(ns, collection="docs")).seqs == []
            assert await store.list_memory([ns], collection="docs") == []
            assert await store.list_documents(ns) == []
            with pytest.raises(MemoryNotFound):
                await store.update_memory(
                    ns,
                    "a-user",
                    content="hijacked",
                    kind="fact",
                    embedding=vec(0.0),
                    expected_revision=1,
                    now=2.0,
                )
            assert await store.delete_memory(ns, "a-user") is False
            assert await store.delete_memory(ns, "a-sess") is False
            assert await store.delete_document(ns, "docs", "d1") is False
            assert await store.clear_memory(ns, collection="docs") == 0
        assert await store.delete_memory(bobs.namespace, bobs.id) is True
        assert await store.clear_memory(BOB, collection=None) == 0
        assert await store.clear_memory(ALICE_ELSEWHERE, collection=None) == 0
        assert [await version(store, ns) for ns in untouched] == versions

        assert await store.get_memory(bobs.namespace, bobs.id) is None
        assert await store.list_memory([ALICE, ALICE_S1]) == mine
        assert await store.list_memory([ALICE], collection="docs") == chunks
        assert await store.list_documents(ALICE) == [doc]
        found = await store.lexical_search(
            [ALICE, ALICE_S1], collection="", terms=["zebra"], limit=9
        )
        assert sorted(found) == sorted(r.seq for r in mine)

    async def test_update_is_compare_and_set(self, store: Store) -> None:
        meta = {"turn_id": "t1", "author": "alice"}
        first = await store.put_memory(
            note(ALICE, "m1", "likes tea", kind="preference", meta=meta), vec(1.0, 0.0)
        )
        v0 = await version(store, ALICE)
        up = await store.update_memory(
            ALICE,
            "m1",
            content="likes coffee",
            kind="fact",
            embedding=vec(0.0, 1.0),
            expected_revision=1,
            now=1_800_000_000.0,
        )
        assert up == replace(
            first, content="likes coffee", kind="fact", revision=2, updated_at=1_800_000_000.0
        )
        assert await store.get_memory(ALICE, "m1") == up
        snap = await store.load_vectors(ALICE, collection="")
        assert (snap.seqs, snap.vectors) == ([first.seq], [vec(0.0, 1.0)])
        v1 = await version(store, ALICE)
        assert v1 != v0
        assert await store.lexical_search([ALICE], collection="", terms=["coffee"], limit=5) == [
            first.seq
        ]
        assert await store.lexical_search([ALICE], collection="", terms=["tea"], limit=5) == []

        with pytest.raises(RevisionConflict) as info:
            await store.update_memory(
                ALICE,
                "m1",
                content="likes water",
                kind="fact",
                embedding=vec(9.0, 9.0),
                expected_revision=1,
                now=1_900_000_000.0,
            )
        assert info.value.current_revision == 2
        assert await store.get_memory(ALICE, "m1") == up
        assert await version(store, ALICE) == v1
        assert (await store.load_vectors(ALICE, collection="")).vectors == [vec(0.0, 1.0)]

        again = await store.update_memory(
            ALICE,
            "m1",
            content="likes water",
            kind="fact",
            embedding=vec(0.0, 0.0),
            expected_revision=2,
            now=1_900_000_000.0,
        )
        assert again.revision == 3

    async def test_concurrent_updates_exactly_one_wins(self, store: Store) -> None:
        for n in range(5):
            await put(store, ALICE, f"m{n}", "before")
            results = await asyncio.gather(
                *(
                    store.update_memory(
                        ALICE,
                        f"m{n}",
                        content=f"written by {who}",
                        kind="fact",
                        embedding=vec(float(i)),
                        expected_revision=1,
                        now=2.0,
                    )
                    for i, who in enumerate(["first", "second"])
                ),
                return_exceptions=True,
            )
            wins = [r for r in results if isinstance(r, MemoryRecord)]
            losses = [r for r in results if isinstance(r, RevisionConflict)]
            assert (len(wins), len(losses)) == (1, 1), results
            assert losses[0].current_revision == 2
            assert wins[0].revision == 2
            assert await store.get_memory(ALICE, f"m{n}") == wins[0]

    async def test_delete_memory(self, store: Store) -> None:
        a = await put(store, ALICE, "a", "keep me")
        await put(store, ALICE, "b", "delete me")
        assert await store.delete_memory(ALICE, "b") is True
        assert await store.delete_memory(ALICE, "b") is False
        assert await store.get_memory(ALICE, "b") is None
        assert await store.locate_memory("b") is None
        assert await store.list_memory([ALICE]) == [a]
        assert await store.lexical_search([ALICE], collection="", terms=["delete"], limit=5) == []
        assert (await store.load_vectors(ALICE, collection="")).seqs == [a.seq]

    async def test_clear_memory_by_collection(self, store: Store) -> None:
        await put(store, ALICE, "m1")
        await put(store, ALICE, "m2")
        await add_doc(store, ALICE, "d1", "docs", chunks=2)
        faq, _ = await add_doc(store, ALICE, "d2", "faq", chunks=1)
        bobs = await put(store, BOB, "b1")

        assert await store.clear_memory(ALICE) == 2  # "": the memory items only
        assert await ids(store, [ALICE]) == []
        assert await ids(store, [ALICE], "docs") == ["d1-0", "d1-1"]
        assert len(await store.list_documents(ALICE)) == 2

        assert await store.clear_memory(ALICE, collection="docs") == 2
        assert await ids(store, [ALICE], "docs") == []
        assert await store.list_documents(ALICE) == [faq]
        assert await ids(store, [ALICE], "faq") == ["d2-0"]

        await put(store, ALICE, "m3")
        assert await store.clear_memory(ALICE, collection=None) == 2  # everything
        assert await ids(store, [ALICE]) == []
        assert await ids(store, [ALICE], "faq") == []
        assert await store.list_documents(ALICE) == []
        assert await store.clear_memory(ALICE, collection=None) == 0
        assert await store.list_memory([BOB]) == [bobs]
