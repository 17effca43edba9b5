"""Memory records, knowledge documents and forget, for the PostgreSQL store.

Each write is one READ COMMITTED transaction that changes its records and the versions of their
(namespace, collection) pairs together (:mod:`.recall_steps` keeps the lock order). That lock
also serialises the inserts into one pair, so seqs become visible in the order they were handed
out and an ``after_seq`` cursor never skips a record that committed late. ``forget_user``
deletes those version rows first, for the same order, and so that a record written while it
waited is deleted with the rest.

Driver errors become :class:`StoreError` in the connection's ``_conn``; here only a duplicate id
is caught, to become :class:`Conflict`.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg  # type: ignore[import-untyped]

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import Document, ForgetReport, MemoryRecord, Namespace, VectorSnapshot
from tether.store.postgres import recall_queries as q
from tether.store.postgres.connection import Connection
from tether.store.postgres.recall_steps import bump, delete_where, insert
from tether.store.postgres.steps import count
from tether.store.rows import document_row, document_values, record_row
from tether.store.rules import document_chunks, search_terms


class Recall(Connection):
    # -- records ---------------------------------------------------------------------------------
    async def put_memory(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        async with self._tx() as conn:
            return (await insert(conn, [(record, embedding)]))[0]

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
        async with self._tx() as conn:
            collection = await conn.fetchval(q.COLLECTION_OF, record_id, ns.key)
            if collection is None:
                raise MemoryNotFound("memory not found")
            await bump(conn, [(ns.key, collection)])  # rolled back with the update if it fails
            # Conditional on the revision: of two updates naming the same one, the second
            # waits for the first's row lock, re-reads the row, and matches nothing.
            row = await conn.fetchrow(
                q.UPDATE_RECORD,
                record_id,
                ns.key,
                content,
                kind,
                bytes(embedding),
                now,
                expected_revision,
            )
            if row is None:
                current = await conn.fetchval(q.REVISION_OF, record_id, ns.key)
                if current is None:
                    raise MemoryNotFound("memory not found")
                raise RevisionConflict(
                    f"memory revision is {current}, not {expected_revision}",
                    current_revision=int(current),
                )
        return record_row(row)

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None:
        return await self.find_memory([ns], record_id)

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        if not namespaces:
            return None
        async with self._conn() as conn:
            row = await conn.fetchrow(q.RECORD_IN, record_id, [ns.key for ns in namespaces])
        return record_row(row) if row is not None else None

    async def locate_memory(self, record_id: str) -> Namespace | None:
        async with self._conn() as conn:
            key = await conn.fetchval(q.LOCATE, record_id)
        return Namespace.from_key(key) if key is not None else None

    async def list_memory(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str = "",
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        if not namespaces or limit <= 0:
            return []
        keys = [ns.key for ns in namespaces]
        async with self._conn() as conn:
            rows = await conn.fetch(q.LIST_RECORDS, keys, collection, after_seq, limit)
        return [record_row(r) for r in rows]

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        wanted = [int(s) for s in seqs]
        if not namespaces or not wanted:
            return []
        async with self._conn() as conn:
            rows = await conn.fetch(q.RECORDS_BY_SEQ, wanted, [ns.key for ns in namespaces])
        found = {r.seq: r for r in map(record_row, rows)}
        return [found[s] for s in dict.fromkeys(wanted) if s in found]

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool:
        async with self._tx() as conn:
            return await delete_where(conn, q.WHERE_RECORD, [record_id, ns.key]) == 1

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        async with self._tx() as conn:
            if collection is None:
                n = await delete_where(conn, q.WHERE_NAMESPACE, [ns.key])
                await conn.execute(q.DELETE_NAMESPACE_DOCUMENTS, ns.key)
                return n
            args = [ns.key, collection]
            n = await delete_where(conn, q.WHERE_COLLECTION, args)
            await conn.execute(q.DELETE_COLLECTION_DOCUMENTS, *args)
            return n

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        # The stop words go here too (PostgreSQL's 'english' configuration drops the same list):
        # a query of nothing but "the" costs no round trip.
        words = search_terms(terms)
        if not namespaces or not words or limit <= 0:
            return []
        keys = [ns.key for ns in namespaces]
        async with self._conn() as conn:
            rows = await conn.fetch(q.LEXICAL_SEARCH, words, keys, collection, limit)
        return [int(r[0]) for r in rows]

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        async with self._conn() as conn:
            version = await conn.fetchval(q.VERSION, ns.key, collection)
        return int(version) if version is not None else 0

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        keys = [ns.key for ns in namespaces]
        if not keys:
            return []
        async with self._conn() as conn:
            rows = await conn.fetch(q.VERSIONS, collection, keys)
        found = {str(r[0]): int(r[1]) for r in rows}
        return [found.get(k, 0) for k in keys]

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot:
        # REPEATABLE READ: the version and the vectors come from one snapshot, so a cache keyed
        # by that version holds exactly these vectors.
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read"):
            version = await conn.fetchval(q.VERSION, ns.key, collection)
            rows = await conn.fetch(q.VECTORS, ns.key, collection)
        return VectorSnapshot(
            int(version) if version is not None else 0,
            [int(r[0]) for r in rows],
            [bytes(r[1]) for r in rows],
        )

    # -- quotas ----------------------------------------------------------------------------------
    async def storage_used(self, tenant: str, user: str) -> int:
        async with self._conn() as conn:
            return int(await conn.fetchval(q.STORAGE_USED, tenant, user))

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        rows = document_chunks(document, chunks)
        async with self._tx() as conn:
            try:
                await conn.execute(q.INSERT_DOCUMENT, *document_values(document))
            except asyncpg.UniqueViolationError as exc:
                raise Conflict(f"a document with id {document.id!r} exists") from exc
            await insert(conn, rows)
        return document

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]:
        async with self._conn() as conn:
            rows = await conn.fetch(q.LIST_DOCUMENTS, ns.key, collection)
        return [document_row(r) for r in rows]

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        args = [document_id, ns.key, collection]
        async with self._tx() as conn:
            await delete_where(conn, q.WHERE_DOCUMENT, args)
            return await conn.fetchval(q.DELETE_DOCUMENT, *args) is not None

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        async with self._tx() as conn:
            # Items, turns and events go with their sessions (ON DELETE CASCADE).
            sessions = count(await conn.execute(q.FORGET_SESSIONS, tenant, user))
            # Version rows before records (the lock order of every memory write). Deleted, not
            # bumped: no row reads as version 0, "nothing here", which is now true, and the
            # clock gives any later write a version never handed out before.
            await conn.execute(q.FORGET_VERSIONS, tenant, user)
            memory = count(await conn.execute(q.FORGET_RECORDS, tenant, user))
            tag = await conn.execute(q.FORGET_DOCUMENTS, tenant, user)
        return ForgetReport(sessions=sessions, memory=memory, documents=count(tag))
