"""Memory records, knowledge documents and forget, for the SQLite store.

Like the rest of the store, each method is one function run on the store's thread; a write is
one transaction (``BEGIN IMMEDIATE``, so every check it makes holds until it commits, across
processes too). The index and version bookkeeping is in :mod:`.recall_steps`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import Document, ForgetReport, MemoryRecord, Namespace, VectorSnapshot
from tether.store.rows import document_row, document_values, record_row
from tether.store.rules import document_chunks
from tether.store.sqlite import recall_queries as q
from tether.store.sqlite.connection import Connection
from tether.store.sqlite.recall_queries import in_list
from tether.store.sqlite.recall_steps import (
    bump,
    changed,
    delete_where,
    fts_query,
    insert,
    read_snapshot,
    version,
    versions_changed,
)

MAX_CACHED_VERSIONS = 4096
"""Version reads kept (a turn's namespaces each); all are dropped when there are more."""


class Recall(Connection):
    # -- records ---------------------------------------------------------------------------------
    async def put_memory(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        return (await self._write(lambda c: insert(c, [(record, embedding)])))[0]

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
        def do(c: sqlite3.Connection) -> MemoryRecord:
            # One BEGIN IMMEDIATE transaction: no other writer, in this process or another,
            # can move the revision between this check and the update.
            row = c.execute(q.RECORD_FOR_UPDATE, (record_id, ns.key)).fetchone()
            if row is None:
                raise MemoryNotFound("memory not found")
            seq, revision, collection, old = row
            if revision != expected_revision:
                raise RevisionConflict(
                    f"memory revision is {revision}, not {expected_revision}",
                    current_revision=int(revision),
                )
            c.execute(q.UNINDEX_TEXT, (seq, old))
            new = c.execute(q.UPDATE_RECORD, (content, kind, bytes(embedding), now, seq))
            updated = record_row(new.fetchone())
            c.execute(q.INDEX_TEXT, (seq, content))
            bump(c, [(ns.key, collection)])
            return updated

        return await self._write(do)

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None:
        return await self.find_memory([ns], record_id)

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        keys = [ns.key for ns in namespaces]
        sql = q.FIND_RECORD.format(ns=in_list(len(keys)))

        def do(c: sqlite3.Connection) -> MemoryRecord | None:
            row = c.execute(sql, (record_id, *keys)).fetchone()
            return record_row(row) if row else None

        return await self._run(do) if keys else None

    async def locate_memory(self, record_id: str) -> Namespace | None:
        def do(c: sqlite3.Connection) -> Namespace | None:
            row = c.execute(q.LOCATE, (record_id,)).fetchone()
            return Namespace.from_key(row[0]) if row else None

        return await self._run(do)

    async def list_memory(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str = "",
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        keys = [ns.key for ns in namespaces]
        sql = q.LIST_RECORDS.format(ns=in_list(len(keys)))

        def do(c: sqlite3.Connection) -> list[MemoryRecord]:
            rows = c.execute(sql, (*keys, collection, after_seq, limit)).fetchall()
            return [record_row(r) for r in rows]

        return await self._run(do) if keys and limit > 0 else []

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        keys, wanted = [ns.key for ns in namespaces], [int(s) for s in seqs]
        sql = q.RECORDS_BY_SEQ.format(ns=in_list(len(keys)))

        def do(c: sqlite3.Connection) -> list[MemoryRecord]:
            rows = c.execute(sql, (json.dumps(wanted), *keys)).fetchall()
            found = {r.seq: r for r in map(record_row, rows)}
            return [found[s] for s in dict.fromkeys(wanted) if s in found]

        return await self._run(do) if keys and wanted else []

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool:
        args = (record_id, ns.key)
        return (
            await self._write(lambda c: delete_where(c, q.WHERE_RECORD, args, versions=True)) == 1
        )

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        def do(c: sqlite3.Connection) -> int:
            if collection is None:
                n = delete_where(c, q.WHERE_NAMESPACE, (ns.key,), versions=True)
                c.execute(q.DELETE_NAMESPACE_DOCUMENTS, (ns.key,))
                return n
            args = (ns.key, collection)
            n = delete_where(c, q.WHERE_COLLECTION, args, versions=True)
            c.execute(q.DELETE_COLLECTION_DOCUMENTS, args)
            return n

        return await self._write(do)

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        keys, query = [ns.key for ns in namespaces], fts_query(terms)
        sql = q.LEXICAL_SEARCH.format(ns=in_list(len(keys)))

        def do(c: sqlite3.Connection) -> list[int]:
            rows = c.execute(sql, (query, *keys, collection, limit)).fetchall()
            return [int(r[0]) for r in rows]

        return await self._run(do) if keys and query and limit > 0 else []

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        return await self._run(lambda c: version(c, ns, collection))

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        """Read once, then answered from memory while no version can have moved: this process
        has changed none (:data:`~.recall_steps.changed`), and no other process has committed
        — its commit would have rung this store (counted as soon as it is queued here, before
        the writer goes on), and moved the data version noted before this store's latest batch
        (for a writer that does not ring). Every turn that recalls asks, and most turns write
        no memory. A store nobody can ring reads every time."""
        keys = tuple(ns.key for ns in namespaces)
        if not keys:
            return []
        heard, mine = self.heard(), changed[0]  # before the read: a change after moves them
        cached = self._versions.get((keys, collection))
        stamp = (mine, self.seen_version(), heard if heard is not None else -1)
        if heard is not None and cached is not None and cached[0] == stamp:
            return list(cached[1])
        sql = q.VERSIONS.format(ns=in_list(len(keys)))
        worker = self._worker

        def read(c: sqlite3.Connection) -> tuple[int, list[int]]:
            # The data version first: the read sees at least what it counts.
            seen = worker.data_version(c) if worker is not None else -1
            found = {str(r[0]): int(r[1]) for r in c.execute(sql, (collection, *keys))}
            return seen, [found.get(k, 0) for k in keys]

        seen, versions = await self._run(read)
        if len(self._versions) >= MAX_CACHED_VERSIONS:
            self._versions.clear()
        self._versions[(keys, collection)] = (
            (mine, seen, heard if heard is not None else -1),
            tuple(versions),
        )
        return versions

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot:
        def read(c: sqlite3.Connection) -> VectorSnapshot:
            current = version(c, ns, collection)
            rows = c.execute(q.VECTORS, (ns.key, collection)).fetchall()
            return VectorSnapshot(current, [int(r[0]) for r in rows], [r[1] for r in rows])

        return await self._run(lambda c: read_snapshot(c, read))

    # -- quotas ----------------------------------------------------------------------------------
    async def storage_used(self, tenant: str, user: str) -> int:
        def read(c: sqlite3.Connection) -> int:
            (used,) = c.execute(q.STORAGE_USED, (tenant, user, user, user)).fetchone()
            return int(used)

        return await self._run(read)

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        rows = document_chunks(document, chunks)

        def do(c: sqlite3.Connection) -> Document:
            try:
                c.execute(q.INSERT_DOCUMENT, document_values(document))
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a document with id {document.id!r} exists") from exc
            insert(c, rows)
            return document

        return await self._write(do)

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]:
        def do(c: sqlite3.Connection) -> list[Document]:
            rows = c.execute(q.LIST_DOCUMENTS, (ns.key, collection, collection)).fetchall()
            return [document_row(r) for r in rows]

        return await self._run(do)

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            args = (document_id, ns.key, collection)
            delete_where(c, q.WHERE_DOCUMENT, args, versions=True)
            return int(c.execute(q.DELETE_DOCUMENT, args).rowcount) == 1

        return await self._write(do)

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        def do(c: sqlite3.Connection) -> ForgetReport:
            # Forgetting means no trace in the file either. Most of it goes now: freed cells and
            # pages are zeroed (secure_delete ON, then back to the connection's FAST), and the
            # full-text index, which keeps deleted terms in its older segments until they
            # merge, is merged; the scrub below takes the rest.
            c.execute("PRAGMA secure_delete=ON")
            try:
                return forget(c)
            finally:
                c.execute("PRAGMA secure_delete=FAST")

        def forget(c: sqlite3.Connection) -> ForgetReport:
            args = (tenant, user)
            # Items, turns and events go with their sessions (ON DELETE CASCADE).
            sessions = int(c.execute(q.FORGET_SESSIONS, args).rowcount)
            memory = delete_where(c, q.WHERE_PERSONAL, args, versions=False)
            documents = int(c.execute(q.FORGET_DOCUMENTS, args).rowcount)
            # Deleted, not bumped: no row reads as version 0, "nothing here", which is now
            # true, and the clock gives any later write a version never seen before.
            versions_changed()
            c.execute(q.FORGET_VERSIONS, args)
            c.execute(q.MERGE_TEXT_INDEX)
            return ForgetReport(sessions=sessions, memory=memory, documents=documents)

        report = await self._write(do)
        # Copies of deleted rows may remain in pages' unused space and in the write-ahead log:
        # the file is rewritten and the log emptied (never failing the forget: the deletion
        # has committed). A forget that deleted nothing leaves nothing to scrub.
        if report.sessions or report.memory or report.documents:
            await self._scrub()
        return report
