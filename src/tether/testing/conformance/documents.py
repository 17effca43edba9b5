"""Knowledge documents and their chunks: added all at once, deleted all at once.

A document's chunks are records of its own namespace and collection, never memory items, and
are written in the same transaction as the document, so no chunk outlives its document.
"""

from __future__ import annotations

import pytest

from tether.errors import Conflict, InvalidInput
from tether.records import CHUNK
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    AGENT,
    ALICE,
    ALICE_ELSEWHERE,
    ALICE_S1,
    BOB,
    TENANT,
    add_doc,
    document,
    ids,
    note,
    put,
    vec,
    version,
)


class DocumentsConformance:
    """Adding, listing and deleting documents together with their chunks.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

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

    async def test_storage_used_is_what_a_user_keeps(self, store: Store) -> None:
        """Text (UTF-8 bytes) and embedding of the user's own records, and of the shared ones
        they wrote; nobody else's, and nothing once deleted."""
        assert await store.storage_used("acme", "alice") == 0
        emb = len(vec(1.0, 0.0))
        await put(store, ALICE, "m1", "héllo")  # six bytes of text
        await put(store, ALICE_S1, "m2", "abc")
        await put(store, TENANT, "t1", "shared", meta={"author": "alice"})
        await put(store, AGENT, "a1", "by bob", meta={"author": "bob"})
        await put(store, BOB, "b1", "bob's")
        await put(store, ALICE_ELSEWHERE, "x1", "same name, other tenant")
        _, chunks = await add_doc(store, ALICE, "d1", chunks=2)
        doc_bytes = sum(len(c.content.encode()) + len(vec(0.0, 1.0)) for c in chunks)
        mine = (6 + emb) + (3 + emb) + (6 + emb) + doc_bytes
        assert await store.storage_used("acme", "alice") == mine
        assert await store.storage_used("acme", "bob") == (6 + emb) + (5 + emb)
        assert await store.storage_used("globex", "alice") == len("same name, other tenant") + emb
        assert await store.storage_used("acme", "carol") == 0

        assert await store.delete_document(ALICE, "docs", "d1") is True
        assert await store.delete_memory(ALICE_S1, "m2") is True
        assert await store.storage_used("acme", "alice") == mine - doc_bytes - (3 + emb)
