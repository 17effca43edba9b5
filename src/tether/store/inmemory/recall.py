"""The memory and knowledge role of the in-memory store: the runnable spec of
:class:`~tether.store.protocol.RecallStore`.

As in the rest of :class:`~tether.store.inmemory.InMemoryStore`, no method awaits, so on one event
loop each call is atomic: a compare-and-set, a document with its chunks, a forget.

Lexical search is deliberately simple: a record scores the number of distinct query terms it
contains (as lower-case words, stop words left out as PostgreSQL does), ties going to the newer
record. The SQL backends rank with BM25 (SQLite) and ``ts_rank_cd`` (PostgreSQL) and stem words;
what all three share, and the conformance suite checks, is that a record matching more of the
terms ranks first.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import replace

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import Document, MemoryRecord, Namespace, VectorSnapshot
from tether.store.inmemory.state import RecordRow, State, words
from tether.store.rules import (
    PERSONAL_SCOPES,
    STOP_WORDS,
    document_chunks,
    provenance,
    search_terms,
)


class Recall(State):
    """Records, versions and documents, kept in dicts."""

    def _in(self, namespaces: Sequence[Namespace], record_id: str) -> RecordRow | None:
        seq = self._seq_of.get(record_id)
        row = self._rows.get(seq) if seq is not None else None
        if row is None or row.record.namespace not in namespaces:
            return None
        return row

    def _seqs(self, namespaces: Iterable[Namespace], collection: str) -> list[int]:
        keys = dict.fromkeys(ns.key for ns in namespaces)
        return sorted(s for k in keys for s in self._buckets.get((k, collection), {}))

    # -- records ---------------------------------------------------------------------------------
    async def put_memory(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        if record.id in self._seq_of:
            raise Conflict(f"a memory record with id {record.id!r} exists")
        stored = self._store(record, embedding)
        self._bump([(stored.namespace.key, stored.collection)])
        return stored

    async def update_memory(
        self,
        ns: Namespace,
        record_id: str,
        *,
        content: str,
        kind: str,
        embedding: bytes,
        expected_revision: int,
        now: float,
    ) -> MemoryRecord:
        row = self._in([ns], record_id)
        if row is None:
            raise MemoryNotFound("memory not found")
        old = row.record
        if old.revision != expected_revision:
            raise RevisionConflict(
                f"memory revision is {old.revision}, not {expected_revision}",
                current_revision=old.revision,
            )
        new = replace(old, content=content, kind=kind, revision=old.revision + 1, updated_at=now)
        self._rows[old.seq] = RecordRow(new, bytes(embedding), words(content))
        self._bump([(ns.key, old.collection)])
        return new

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None:
        row = self._in([ns], record_id)
        return row.record if row is not None else None

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        row = self._in(namespaces, record_id)
        return row.record if row is not None else None

    async def locate_memory(self, record_id: str) -> Namespace | None:
        seq = self._seq_of.get(record_id)
        return self._rows[seq].record.namespace if seq is not None else None

    async def list_memory(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str = "",
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        seqs = [s for s in self._seqs(namespaces, collection) if s > after_seq]
        return [self._rows[s].record for s in seqs[: max(limit, 0)]]

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        out = []
        for seq in dict.fromkeys(seqs):
            row = self._rows.get(seq)
            if row is not None and row.record.namespace in namespaces:
                out.append(row.record)
        return out

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool:
        row = self._in([ns], record_id)
        if row is None:
            return False
        self._bump(self._drop([row.record.seq]))
        return True

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        seqs = [
            seq
            for (key, coll), bucket in self._buckets.items()
            if key == ns.key and collection in (None, coll)
            for seq in bucket
        ]
        self._bump(self._drop(seqs))
        for doc in list(self._documents.values()):
            if doc.namespace == ns and collection in (None, doc.collection):
                del self._documents[doc.id]
        return len(seqs)

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        # A term is matched as a whole: all of its words must be in the record.
        wanted = [w - STOP_WORDS for w in map(words, search_terms(terms))]
        wanted = [w for w in wanted if w]
        scored = []
        for seq in self._seqs(namespaces, collection):
            has = self._rows[seq].words
            score = sum(1 for w in set(wanted) if w <= has)
            if score:
                scored.append((score, seq))
        scored.sort(reverse=True)
        return [seq for _, seq in scored[: max(limit, 0)]]

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        return self._versions.get((ns.key, collection), 0)

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        return [self._versions.get((ns.key, collection), 0) for ns in namespaces]

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot:
        seqs = self._seqs([ns], collection)
        return VectorSnapshot(
            self._versions.get((ns.key, collection), 0),
            seqs,
            [self._rows[s].embedding for s in seqs],
        )

    # -- quotas ----------------------------------------------------------------------------------
    async def storage_used(self, tenant: str, user: str) -> int:
        used = 0
        for row in self._rows.values():
            ns = row.record.namespace
            if ns.tenant != tenant:
                continue
            if ns.owner == user or (not ns.owner and provenance(row.record)[1] == user):
                used += len(row.record.content.encode()) + len(row.embedding)
        return used

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        rows = document_chunks(document, chunks)
        # Every check before the first write: a refused document leaves nothing behind.
        if document.id in self._documents:
            raise Conflict(f"a document with id {document.id!r} exists")
        ids = [r.id for r, _ in rows]
        taken = [i for i in ids if i in self._seq_of] or [i for i in ids if ids.count(i) > 1]
        if taken:
            raise Conflict(f"a memory record with id {taken[0]!r} exists")
        self._documents[document.id] = replace(document, meta=copy.deepcopy(document.meta))
        for record, embedding in rows:
            self._store(record, embedding)
        if rows:
            self._bump([(document.namespace.key, document.collection)])
        return document

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]:
        return [
            d
            for d in self._documents.values()
            if d.namespace == ns and collection in (None, d.collection)
        ]

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        seqs = [
            seq
            for seq in self._buckets.get((ns.key, collection), {})
            if self._rows[seq].record.document_id == document_id
        ]
        self._bump(self._drop(seqs))
        doc = self._documents.get(document_id)
        if doc is None or doc.namespace != ns or doc.collection != collection:
            return False
        del self._documents[document_id]
        return True

    # -- forget ----------------------------------------------------------------------------------
    def _forget_recall(self, tenant: str, user: str) -> tuple[int, int]:
        """Delete the user's session and user records, documents and versions (the store's
        ``forget_user`` deletes the sessions): ``(records, documents)``."""

        def mine(ns: Namespace) -> bool:
            return ns.tenant == tenant and ns.owner == user and ns.scope in PERSONAL_SCOPES

        seqs = [seq for seq, row in self._rows.items() if mine(row.record.namespace)]
        self._drop(seqs)
        docs = [d.id for d in self._documents.values() if mine(d.namespace)]
        for doc_id in docs:
            del self._documents[doc_id]
        # Removed, not bumped: version 0 reads "nothing here", which is now true, and the clock
        # gives any later write a version never handed out before.
        for pair in [p for p in self._versions if mine(Namespace.from_key(p[0]))]:
            del self._versions[pair]
        return len(seqs), len(docs)
