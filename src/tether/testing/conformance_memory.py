"""The memory conformance suite: what every store's memory and knowledge half must do.

The :class:`~tether.store.recall.RecallStore` counterpart of
:class:`~tether.testing.conformance.StoreConformance`, used the same way: subclass
:class:`MemoryConformance` in a test module pytest collects and provide a fixture named
``store`` that yields an **opened, empty** store, fresh for every test::

    class TestMyStoreMemory(MemoryConformance):
        @pytest.fixture
        async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
            s = MyStore(tmp_path / "db")
            await s.open()
            try:
                yield s
            finally:
                await s.close()

Most of it is about isolation: every test that writes to one user's namespace also checks that
another user (same ids, same session id) and the same user id in another tenant see nothing of
it and can change nothing of it.

Lexical ranking is checked only where every backend agrees: a record matching more of the
query's terms ranks before one matching fewer, and English stop words match nothing. (SQLite's
BM25 also weighs rare terms above common ones; PostgreSQL's ``ts_rank_cd`` does not look at
other documents at all. Stemming differs too, so it is not checked.)

This module imports only pytest and tether, so it can ship inside the package.
"""

from __future__ import annotations

import asyncio
from array import array
from dataclasses import replace
from typing import Any

import pytest

from tether.errors import (
    Conflict,
    InvalidInput,
    MemoryNotFound,
    RevisionConflict,
    SessionNotFound,
)
from tether.records import (
    CHUNK,
    Document,
    ForgetReport,
    MemoryRecord,
    Namespace,
    NewItem,
    SessionKey,
    TurnEnding,
)
from tether.store.protocol import Store
from tether.testing.conformance import ev, key, new_session, running_turn

ALICE = Namespace.user("acme", "alice")
BOB = Namespace.user("acme", "bob")
ALICE_ELSEWHERE = Namespace.user("globex", "alice")
"""The same user id in another tenant: another person."""
ALICE_S1 = Namespace.session(SessionKey("acme", "alice", "s1"))
BOB_S1 = Namespace.session(SessionKey("acme", "bob", "s1"))
"""Another user's session with the same session id."""
ALICE_S2 = Namespace.session(SessionKey("acme", "alice", "s2"))
AGENT = Namespace.of_agent("acme", "assistant")
TENANT = Namespace.of_tenant("acme")
FOREIGN = (BOB, BOB_S1, ALICE_ELSEWHERE)
"""Namespaces from which nothing of Alice's may be seen or changed."""


def vec(*xs: float) -> bytes:
    """A float32 embedding, as the memory layer stores them."""
    return array("f", xs).tobytes()


def note(
    ns: Namespace,
    record_id: str,
    content: str,
    *,
    kind: str = "fact",
    collection: str = "",
    document_id: str | None = None,
    meta: dict[str, Any] | None = None,
    at: float = 1_700_000_000.0,
) -> MemoryRecord:
    return MemoryRecord(
        id=record_id,
        namespace=ns,
        kind=kind,
        content=content,
        collection=collection,
        document_id=document_id,
        meta=meta or {},
        created_at=at,
        updated_at=at,
    )


async def put(
    store: Store, ns: Namespace, record_id: str, content: str = "", **kw: Any
) -> MemoryRecord:
    return await store.put_memory(note(ns, record_id, content or record_id, **kw), vec(1.0, 0.0))


def document(ns: Namespace, doc_id: str, collection: str, chunks: int) -> Document:
    return Document(
        id=doc_id,
        namespace=ns,
        collection=collection,
        name=f"{doc_id}.txt",
        media_type="text/plain",
        chunks=chunks,
        chars=100 * chunks,
        created_at=1_700_000_000.0,
        meta={"source": "upload"},
    )


async def add_doc(
    store: Store, ns: Namespace, doc_id: str, collection: str = "docs", chunks: int = 2
) -> tuple[Document, list[MemoryRecord]]:
    doc = document(ns, doc_id, collection, chunks)
    parts = [
        (
            note(
                ns,
                f"{doc_id}-{n}",
                f"part {n} of {doc_id}",
                kind=CHUNK,
                collection=collection,
                meta={"document": doc.name, "chunk": n},
            ),
            vec(float(n), 1.0),
        )
        for n in range(chunks)
    ]
    await store.add_document(doc, parts)
    stored = await store.list_memory([ns], collection=collection, limit=1000)
    return doc, [r for r in stored if r.document_id == doc_id]


async def ids(store: Store, namespaces: list[Namespace], collection: str = "") -> list[str]:
    return [r.id for r in await store.list_memory(namespaces, collection=collection, limit=1000)]


async def version(store: Store, ns: Namespace, collection: str = "") -> int:
    single = await store.vector_version(ns, collection=collection)
    # The batched read must always agree with the single one.
    assert await store.vector_versions([ns], collection=collection) == [single]
    return single


class MemoryConformance:
    """Every test receives ``store``: an opened, empty Store provided by the subclass."""

    # -- records ---------------------------------------------------------------------------------
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
        assert await store.delete_turn_memory([BOB, BOB_S1], "t1", "model") == 1
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

    # -- compare-and-set -------------------------------------------------------------------------
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

    # -- versions and vectors --------------------------------------------------------------------
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
        assert await store.delete_turn_memory([ALICE], "t-none", "model") == 0
        await still()

        # Each kind of change moves it.
        await store.update_memory(
            ALICE, "m1", content="pear", kind="fact", embedding=b"", expected_revision=1, now=1.0
        )
        await moved()
        assert await store.delete_memory(ALICE, "m1") is True
        await moved()
        await put(store, ALICE, "m2", meta={"turn_id": "t2", "author": "model"})
        await moved()
        assert await store.delete_turn_memory([ALICE], "t2", "model") == 1
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

    # -- lexical search --------------------------------------------------------------------------
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

    # -- deleting ---------------------------------------------------------------------------------
    async def test_delete_turn_memory(self, store: Store) -> None:
        def by(turn: str, author: str) -> dict[str, Any]:
            return {"turn_id": turn, "author": author, "session_id": "s1"}

        await put(store, ALICE_S1, "s-t1-model", meta=by("t1", "model"))
        await put(store, ALICE, "u-t1-model", meta=by("t1", "model"))
        await put(store, ALICE, "u-t1-alice", meta=by("t1", "alice"))
        await put(store, ALICE, "u-t2-model", meta=by("t2", "model"))
        await put(store, ALICE, "u-plain")
        await put(store, TENANT, "t-t1-model", meta=by("t1", "model"))
        await put(store, BOB_S1, "bob-t1-model", meta=by("t1", "model"))

        assert await store.delete_turn_memory([ALICE_S1, ALICE], "t1", "model") == 2
        assert await ids(store, [ALICE_S1, ALICE]) == ["u-t1-alice", "u-t2-model", "u-plain"]
        assert await ids(store, [TENANT, BOB_S1]) == ["t-t1-model", "bob-t1-model"]
        assert await store.delete_turn_memory([ALICE_S1, ALICE], "t1", "model") == 0
        assert await store.delete_turn_memory([], "t1", "model") == 0

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

    # -- documents --------------------------------------------------------------------------------
    async def test_documents_with_their_chunks(self, store: Store) -> None:
        d1, chunks = await add_doc(store, ALICE, "d1", "docs", chunks=3)
        assert [c.id for c in chunks] == ["d1-0", "d1-1", "d1-2"]  # in order, seqs growing
        assert all(c.document_id == "d1" and c.kind == CHUNK for c in chunks)
        assert chunks[0].meta == {"document": "d1.txt", "chunk": 0}
        assert await store.list_memory([ALICE]) == []  # chunks are not memory items
        d2, _ = await add_doc(store, ALICE, "d2", "docs", chunks=1)
        d3, _ = await add_doc(store, ALICE, "d3", "faq", chunks=1)
        assert await store.list_documents(ALICE) == [d1, d2, d3]
        assert await store.list_documents(ALICE, collection="docs") == [d1, d2]
        assert await store.list_documents(ALICE, collection="other") == []

        assert await store.delete_document(ALICE, "faq", "d1") is False  # wrong collection
        assert await store.delete_document(ALICE_S1, "docs", "d1") is False
        assert await ids(store, [ALICE], "docs") == ["d1-0", "d1-1", "d1-2", "d2-0"]

        assert await store.delete_document(ALICE, "docs", "d1") is True
        assert await ids(store, [ALICE], "docs") == ["d2-0"]
        assert await store.list_documents(ALICE) == [d2, d3]
        assert await store.memory_by_seq([ALICE], [c.seq for c in chunks]) == []
        found = await store.lexical_search([ALICE], collection="docs", terms=["d1"], limit=9)
        assert found == []
        assert (await store.load_vectors(ALICE, collection="docs")).seqs == [
            r.seq for r in await store.list_memory([ALICE], collection="docs")
        ]
        assert await store.delete_document(ALICE, "docs", "d1") is False

    async def test_add_document_is_all_or_nothing(self, store: Store) -> None:
        taken = await put(store, ALICE, "taken")
        before = await version(store, ALICE, "docs")
        doc = document(ALICE, "d1", "docs", 2)
        clash = [
            (note(ALICE, "d1-0", "first", kind=CHUNK, collection="docs"), vec(1.0)),
            (note(ALICE, "taken", "second", kind=CHUNK, collection="docs"), vec(2.0)),
        ]
        with pytest.raises(Conflict):
            await store.add_document(doc, clash)
        assert await store.list_documents(ALICE) == []
        assert await ids(store, [ALICE], "docs") == []
        assert await store.get_memory(ALICE, "taken") == taken
        assert await version(store, ALICE, "docs") == before

        ok = [(note(ALICE, "d1-0", "first", kind=CHUNK, collection="docs"), vec(1.0))]
        await store.add_document(doc, ok)
        other = [(note(ALICE, "d1-9", "again", kind=CHUNK, collection="docs"), vec(1.0))]
        with pytest.raises(Conflict):
            await store.add_document(doc, other)  # the document id is taken
        assert await ids(store, [ALICE], "docs") == ["d1-0"]
        assert await store.list_documents(ALICE) == [doc]

        # A chunk outside the document's namespace or collection would outlive its document.
        stray = [(note(BOB, "x-0", "stray", kind=CHUNK, collection="docs"), vec(1.0))]
        with pytest.raises(InvalidInput):
            await store.add_document(document(ALICE, "d2", "docs", 1), stray)
        wrong = [(note(ALICE, "x-1", "stray", kind=CHUNK, collection="faq"), vec(1.0))]
        with pytest.raises(InvalidInput):
            await store.add_document(document(ALICE, "d3", "docs", 1), wrong)
        with pytest.raises(InvalidInput):  # collection "" holds memory items, not documents
            await store.add_document(document(ALICE, "d4", "", 0), [])
        assert await store.list_documents(ALICE) == [doc]
        assert await store.list_memory([BOB], collection="docs") == []

    # -- forget -----------------------------------------------------------------------------------
    async def test_forget_user(self, store: Store) -> None:
        alice_s1, alice_s2 = key("s1"), key("s2")
        bob_s1, elsewhere_s1 = key("s1", owner="bob"), key("s1", tenant="globex")

        def turn(k: SessionKey) -> str:
            return f"t-{k.tenant}-{k.owner}-{k.session_id}"  # turn ids are unique store-wide

        for k in (alice_s1, alice_s2, bob_s1, elsewhere_s1):
            await new_session(store, k)
            lease = await running_turn(store, k, turn(k))
            await store.append(lease, turn(k), [NewItem("assistant", "hi")], [ev(3)])

        await put(store, ALICE, "a-user", "alice fact")
        await put(store, ALICE_S1, "a-sess", "alice session note")
        await add_doc(store, ALICE, "a-doc", "notes", chunks=2)
        shared = [
            await put(store, AGENT, "agent-rule", meta={"author": "alice"}),
            await put(store, TENANT, "tenant-fact", meta={"author": "alice"}),
        ]
        bobs = [await put(store, BOB, "b-user"), await put(store, BOB_S1, "b-sess")]
        elsewhere = await put(store, ALICE_ELSEWHERE, "e-user", "alice fact")
        e_doc, e_chunks = await add_doc(store, ALICE_ELSEWHERE, "e-doc", "notes", chunks=1)
        versions = {ns: await version(store, ns) for ns in (ALICE, ALICE_S1)}
        notes_version = await version(store, ALICE, "notes")

        report = await store.forget_user("acme", "alice")
        assert report == ForgetReport(sessions=2, memory=4, documents=1)

        for k in (alice_s1, alice_s2):
            assert await store.get_session(k) is None
            assert await store.get_turn(k, turn(k)) is None
            assert await store.list_events(k, turn(k)) == []
        assert await store.list_sessions("acme", "alice") == []
        for record_id in ("a-user", "a-sess", "a-doc-0", "a-doc-1"):
            assert await store.locate_memory(record_id) is None
        assert await store.list_memory([ALICE, ALICE_S1]) == []
        assert await store.list_memory([ALICE], collection="notes") == []
        assert await store.list_documents(ALICE) == []
        assert (await store.load_vectors(ALICE, collection="notes")).seqs == []
        found = await store.lexical_search(
            [ALICE, ALICE_S1], collection="", terms=["alice"], limit=9
        )
        assert found == []
        for ns, before in versions.items():
            assert await version(store, ns) != before
        assert await version(store, ALICE, "notes") != notes_version

        # Shared memory stays, and so does everyone else's data.
        assert await store.list_memory([AGENT, TENANT]) == shared
        assert await store.list_memory([BOB, BOB_S1]) == bobs
        assert [i.content for i in await store.list_items(bob_s1)] == ["hello", "hi"]
        assert [i.content for i in await store.list_items(elsewhere_s1)] == ["hello", "hi"]
        assert await store.list_memory([ALICE_ELSEWHERE]) == [elsewhere]
        assert await store.list_memory([ALICE_ELSEWHERE], collection="notes") == e_chunks
        assert await store.list_documents(ALICE_ELSEWHERE) == [e_doc]

        assert await store.forget_user("acme", "alice") == ForgetReport()
        # Forgotten is not banned: the user can start again.
        await new_session(store, alice_s1)
        again = await put(store, ALICE, "a-user", "new fact")
        assert await store.list_memory([ALICE]) == [again]

    # -- history summaries (the store half of compaction) -----------------------------------------
    async def test_latest_summary_skips_failed_and_rolled_back_turns(self, store: Store) -> None:
        k = await new_session(store)
        assert await store.latest_summary(k) is None
        lease = await running_turn(store, k, "t1")
        done = TurnEnding("completed", "answered")
        await store.end_turn(lease, "t1", done, [NewItem("summary", "first summary")], [ev(3)])
        first = await store.latest_summary(k)
        assert first is not None and (first.kind, first.content) == ("summary", "first summary")

        await running_turn(store, k, "t2", lease=lease)
        failed = TurnEnding("failed", "model_error", error="boom")
        await store.end_turn(lease, "t2", failed, [NewItem("summary", "from a failed turn")], [])
        await running_turn(store, k, "t3", lease=lease)
        rolled = TurnEnding("rolled_back", "rollback")
        await store.end_turn(lease, "t3", rolled, [NewItem("summary", "rolled back")], [])
        assert await store.latest_summary(k) == first

        await running_turn(store, k, "t4", lease=lease)
        items = [NewItem("summary", "newest summary"), NewItem("assistant", "after it")]
        await store.end_turn(lease, "t4", done, items, [ev(3)])
        newest = await store.latest_summary(k)
        assert newest is not None and newest.content == "newest summary"
        assert newest.seq > first.seq
        with pytest.raises(SessionNotFound):
            await store.latest_summary(key("nobody"))
