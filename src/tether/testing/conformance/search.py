"""What recall searches: vector snapshots with their versions, and lexical search.

A vector cache relies on the version: it moves on every change to a namespace's collection and
only then. Lexical ranking is checked only where every backend agrees: a record matching more of
the query's terms ranks before one matching fewer, and English stop words match nothing.
(SQLite's BM25 also weighs rare terms above common ones; PostgreSQL's ``ts_rank_cd`` does not
look at other documents at all. Stemming differs too, so it is not checked.)
"""

from __future__ import annotations

from array import array

import pytest

from tether.errors import Conflict, RevisionConflict
from tether.records import CHUNK, Namespace
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    ALICE,
    ALICE_ELSEWHERE,
    ALICE_S1,
    ALICE_S2,
    BOB,
    BOB_S1,
    TENANT,
    add_doc,
    note,
    put,
    vec,
    version,
)


class SearchConformance:
    """Vector versions and snapshots, and lexical search, within namespaces and collections.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_versions_move_on_every_change_and_only_then(self, store: Store) -> None:
        # What a vector cache relies on: the version read with the vectors moves on every
        # change, and a version seen again (0 for "nothing here", say) means the same vectors.
        last: dict[str, int] = {}
        seen: dict[tuple[str, int], tuple[list[int], list[bytes]]] = {}

        async def moved(collection: str = "") -> None:
            now = await version(store, ALICE, collection)
            snap = await store.load_vectors(ALICE, collection=collection)
            assert snap.version == now
            assert now != last.get(collection), f"{collection!r}: version did not move"
            contents = (snap.seqs, snap.vectors)
            assert seen.setdefault((collection, now), contents) == contents, f"{now} reused"
            last[collection] = now

        async def still(collection: str = "") -> None:
            assert await version(store, ALICE, collection) == last[collection]

        await moved()
        m1 = await put(store, ALICE, "m1", "apple", meta={"turn_id": "t1", "author": "model"})
        await moved()
        # Reads do not move it.
        await store.get_memory(ALICE, "m1")
        await store.find_memory([ALICE], "m1")
        await store.locate_memory("m1")
        await store.list_memory([ALICE])
        await store.memory_by_seq([ALICE], [m1.seq])
        await store.lexical_search([ALICE], collection="", terms=["apple"], limit=5)
        await store.load_vectors(ALICE, collection="")
        await store.list_documents(ALICE)
        await still()
        # Neither do changes elsewhere: another namespace, another collection, failures.
        await put(store, BOB, "b1")
        await put(store, ALICE_S1, "s1")
        await add_doc(store, ALICE, "d1")
        await still()
        with pytest.raises(Conflict):
            await put(store, ALICE, "m1")
        with pytest.raises(RevisionConflict):
            await store.update_memory(
                ALICE, "m1", content="x", kind="fact", embedding=b"", expected_revision=7, now=1.0
            )
        assert await store.delete_memory(ALICE, "nope") is False
        await still()

        # Each kind of change moves it.
        await store.update_memory(
            ALICE, "m1", content="pear", kind="fact", embedding=b"", expected_revision=1, now=1.0
        )
        await moved()
        assert await store.delete_memory(ALICE, "m1") is True
        await moved()
        await put(store, ALICE, "m3")
        await moved()
        assert await store.clear_memory(ALICE) == 1
        await moved()

        await moved("docs")  # the chunks added above
        await add_doc(store, ALICE, "d2")
        await moved("docs")
        assert await store.delete_document(ALICE, "docs", "d1") is True
        await moved("docs")
        assert await store.clear_memory(ALICE, collection="docs") == 2
        await moved("docs")
        await add_doc(store, ALICE, "d3")
        await moved("docs")
        await put(store, ALICE, "m4")
        await moved()
        assert await store.clear_memory(ALICE, collection=None) == 3
        await moved()
        await moved("docs")
        await put(store, ALICE, "m5")
        await moved()
        await store.forget_user("acme", "alice")
        await moved()
        # After a forget, a new write still gets a version never seen before.
        await put(store, ALICE, "m6")
        await moved()

    async def test_vector_versions_reads_many_namespaces_in_order(self, store: Store) -> None:
        await put(store, ALICE, "a1")
        await put(store, BOB, "b1")
        await put(store, BOB, "b2")
        nobody = Namespace.user("acme", "nobody")
        asked = [BOB, nobody, ALICE, BOB]
        got = await store.vector_versions(asked, collection="")
        singles = [await store.vector_version(ns, collection="") for ns in asked]
        assert got == singles
        assert got[1] == 0 and got[0] == got[3] and got[0] != got[2] and got[2] > 0
        assert await store.vector_versions([], collection="") == []
        assert await store.vector_versions([ALICE], collection="docs") == [0]

    async def test_load_vectors_round_trips_float32_bytes(self, store: Store) -> None:
        floats = [[(n * 7 + i) % 11 / 3.0 - 1.5 for i in range(256)] for n in range(5)]
        stored = [
            await store.put_memory(note(ALICE, f"m{n}", f"note {n}"), vec(*f))
            for n, f in enumerate(floats)
        ]
        stored.append(await store.put_memory(note(ALICE, "other-width", "x"), vec(1.0, 2.0)))
        stored.append(await store.put_memory(note(ALICE, "empty", "no embedding"), b""))
        await store.put_memory(note(ALICE, "c", "chunk", collection="docs"), vec(3.0))
        await store.put_memory(note(BOB, "b", "bob's"), vec(4.0))

        snap = await store.load_vectors(ALICE, collection="")
        assert snap.version == await version(store, ALICE)
        assert snap.seqs == [r.seq for r in stored]
        assert snap.vectors[:5] == [vec(*f) for f in floats]
        assert snap.vectors[5:] == [vec(1.0, 2.0), b""]
        back = array("f")
        back.frombytes(snap.vectors[2])
        assert list(back) == pytest.approx(floats[2], abs=1e-6)

        assert await store.delete_memory(ALICE, "m1") is True
        assert stored[1].seq not in (await store.load_vectors(ALICE, collection="")).seqs
        docs = await store.load_vectors(ALICE, collection="docs")
        assert docs.vectors == [vec(3.0)]
        empty = await store.load_vectors(ALICE_S2, collection="")
        assert (empty.seqs, empty.vectors) == ([], [])

    async def test_lexical_search_ranks_better_matches_first(self, store: Store) -> None:
        # Added first, so that "newest first" among equals cannot be what puts it first.
        best = await put(store, ALICE, "best", "the zebra ate a red apple today")
        common = [
            await put(store, ALICE, f"c{n}", f"one red apple a day, number {n}") for n in range(6)
        ]
        await put(store, ALICE, "none", "nothing relevant in here at all")

        found = await store.lexical_search(
            [ALICE], collection="", terms=["apple", "zebra"], limit=10
        )
        assert found[0] == best.seq
        assert sorted(found) == sorted([best.seq] + [r.seq for r in common])
        top = await store.lexical_search([ALICE], collection="", terms=["apple", "zebra"], limit=3)
        assert len(top) == 3 and top[0] == best.seq
        assert await store.lexical_search([ALICE], collection="", terms=["zebra"], limit=5) == [
            best.seq
        ]
        assert await store.lexical_search([ALICE], collection="", terms=["ZEBRA"], limit=5) == [
            best.seq
        ]
        assert await store.lexical_search([ALICE], collection="", terms=["giraffe"], limit=5) == []
        assert await store.lexical_search([ALICE], collection="", terms=[], limit=5) == []
        assert await store.lexical_search([ALICE], collection="", terms=["apple"], limit=0) == []
        assert await store.lexical_search([], collection="", terms=["apple"], limit=5) == []

    async def test_stop_words_match_nothing(self, store: Store) -> None:
        # The English stop words of PostgreSQL's configuration, on every backend: they would
        # match nearly every record and say nothing about which is relevant.
        await put(store, ALICE, "cat", "The cat is on the mat")
        zebra = await put(store, ALICE, "zebra", "a zebra")

        async def search(*terms: str) -> list[int]:
            return await store.lexical_search([ALICE], collection="", terms=terms, limit=5)

        assert await search("the", "is", "on", "The") == []
        assert await search("the", "a", "zebra") == [zebra.seq]

    async def test_lexical_search_stays_in_its_namespaces_and_collection(
        self, store: Store
    ) -> None:
        a = await put(store, ALICE, "a", "zebra one")
        chunk = await put(store, ALICE, "c", "zebra two", collection="docs", kind=CHUNK)
        b = await put(store, BOB, "b", "zebra three")
        t = await put(store, TENANT, "t", "zebra four")
        s = await put(store, ALICE_S1, "s", "zebra five")

        async def search(namespaces: list[Namespace], collection: str = "") -> list[int]:
            found = await store.lexical_search(
                namespaces, collection=collection, terms=["zebra"], limit=10
            )
            return sorted(found)

        assert await search([ALICE]) == [a.seq]
        assert await search([ALICE], "docs") == [chunk.seq]
        assert await search([ALICE, TENANT]) == [a.seq, t.seq]
        assert await search([ALICE_S1, ALICE]) == [a.seq, s.seq]
        assert await search([BOB]) == [b.seq]
        assert await search([BOB_S1, ALICE_ELSEWHERE, ALICE_S2]) == []
        assert await search([TENANT], "docs") == []

    async def test_unicode_and_search_syntax_are_only_text(self, store: Store) -> None:
        contents = [
            "Café au lait ☕ in Zürich",
            'He said "hello" * NEAR: the-end (x) ^y AND OR NOT {a} [b] col:umn',
            "東京タワーに行く",
            "emoji 🎉🎉 and\nnew\tlines",
            "O'Brien's \\ back\\slash %_ like 100% 'quoted' \"\" --dash ; DROP TABLE memory;",
        ]
        stored = [await put(store, ALICE, f"m{n}", c) for n, c in enumerate(contents)]
        assert [r.content for r in await store.list_memory([ALICE])] == contents
        for r in stored:
            assert await store.get_memory(ALICE, r.id) == r
        seqs = {r.seq for r in stored}
        odd_terms = [
            ['"'], ["*"], ["NEAR"], ["AND", "OR", "NOT"], ["a:b"], ["-x"], ["the-end"], ["(x)"],
            ["^y"], ["%"], ["_"], ["'"], [""], [" "], ['"hello"'], ["{a}"], ["col:umn"],
            ["東京タワーに行く"], ["🎉"], ["\\"], ["x" * 300], ["DROP", "TABLE"],
        ]  # fmt: skip
        for terms in odd_terms:
            found = await store.lexical_search([ALICE], collection="", terms=terms, limit=10)
            assert set(found) <= seqs, terms
        by = {c: r.seq for c, r in zip(contents, stored, strict=True)}

        async def only(term: str) -> list[int]:
            return await store.lexical_search([ALICE], collection="", terms=[term], limit=10)

        assert await only("café") == [by[contents[0]]]
        assert await only("hello") == [by[contents[1]]]
        assert await only("lines") == [by[contents[3]]]
        updated = await store.update_memory(
            ALICE,
            "m0",
            content='now "NEAR" * :',
            kind="fact",
            embedding=b"",
            expected_revision=1,
            now=2.0,
        )
        assert updated.content == 'now "NEAR" * :'
        assert await only("café") == []
