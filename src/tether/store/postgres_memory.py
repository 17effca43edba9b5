"""The memory and knowledge half of the PostgreSQL store (``RecallStore``).

Each write is one READ COMMITTED transaction that changes its records and the versions of their
(namespace, collection) pairs together. Lock order, so memory writes cannot deadlock one
another: every write first takes the version rows of the pairs it changes (an upsert, in sorted
order), then touches records. That lock also serialises the inserts into one pair, so seqs
become visible in the order they were handed out and an ``after_seq`` cursor never skips a
record that committed late. ``forget_user`` deletes those version rows first, for the same
order, and so that a record written while it waited is deleted with the rest.

Driver errors become :class:`StoreError` in the store's ``_conn``; here only a duplicate id is
caught, to become :class:`Conflict`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import asyncpg  # type: ignore[import-untyped]

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import Document, ForgetReport, MemoryRecord, Namespace, VectorSnapshot
from tether.store.postgres_writes import Conn
from tether.store.rows import (
    DOCUMENT_COLS,
    DOCUMENT_INSERT_COLS,
    INSERT_COLS,
    RECORD_COLS,
    document_row,
    document_values,
    record_row,
    record_values,
)
from tether.store.rules import PERSONAL_SCOPES, document_chunks

Pair = tuple[str, str]
"""``(namespace key, collection)``: what a version counts the changes of."""

# -- statements --------------------------------------------------------------------------------
# The column types of INSERT_COLS: twelve texts, the revision, two times, the embedding.
_RECORD_TYPES = ("text",) * 12 + ("bigint", "float8", "float8", "bytea")
_ARRAYS = ", ".join(f"${n}::{t}[]" for n, t in enumerate(_RECORD_TYPES, 1))
INSERT_RECORDS = (
    f"INSERT INTO memory ({INSERT_COLS}) SELECT {INSERT_COLS}"
    f" FROM unnest({_ARRAYS}) WITH ORDINALITY AS u({INSERT_COLS}, n) ORDER BY n"
    " RETURNING id, seq"
)
BUMP = (
    "INSERT INTO memory_versions (ns, collection, scope, tenant, owner, version)"
    " SELECT u.ns, u.collection, u.scope, u.tenant, u.owner, nextval('memory_clock')"
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY"
    " AS u(ns, collection, scope, tenant, owner, n) ORDER BY u.n"
    " ON CONFLICT (ns, collection) DO UPDATE SET version = excluded.version"
)
VERSION = "SELECT version FROM memory_versions WHERE ns = $1 AND collection = $2"
RECORD_IN = f"SELECT {RECORD_COLS} FROM memory WHERE id = $1 AND ns = ANY($2::text[])"
LOCATE = "SELECT ns FROM memory WHERE id = $1"
LIST_RECORDS = (
    f"SELECT {RECORD_COLS} FROM memory WHERE ns = ANY($1::text[]) AND collection = $2"
    " AND seq > $3 ORDER BY seq LIMIT $4"
)
RECORDS_BY_SEQ = (
    f"SELECT {RECORD_COLS} FROM memory WHERE seq = ANY($1::bigint[]) AND ns = ANY($2::text[])"
)
COLLECTION_OF = "SELECT collection FROM memory WHERE id = $1 AND ns = $2"
UPDATE_RECORD = (
    "UPDATE memory SET content = $3, kind = $4, embedding = $5, updated_at = $6,"
    f" revision = revision + 1 WHERE id = $1 AND ns = $2 AND revision = $7 RETURNING {RECORD_COLS}"
)
REVISION_OF = "SELECT revision FROM memory WHERE id = $1 AND ns = $2"
# Each term goes through plainto_tsquery, which reads it as plain words (nothing in it is ever
# an operator); the text forms of those queries are valid tsquery syntax and are OR-ed, then
# cast rather than parsed by to_tsquery, which would stem the already stemmed lexemes again.
# Terms that are only stop words drop out; with none left the query is NULL and matches nothing.
# MATERIALIZED: without statistics (a fresh table) the planner otherwise inlines q and rebuilds
# the query once per row instead of using the GIN index (measured: 483 ms against 16 at 10k).
LEXICAL_SEARCH = (
    "WITH q AS MATERIALIZED"
    " (SELECT array_to_string(array_agg('(' || t.q::text || ')'), ' | ')::tsquery AS q"
    "  FROM (SELECT plainto_tsquery('english', term) AS q FROM unnest($1::text[]) AS term) t"
    "  WHERE numnode(t.q) > 0)"
    " SELECT m.seq FROM memory m, q WHERE m.tsv @@ q.q AND m.ns = ANY($2::text[])"
    " AND m.collection = $3 ORDER BY ts_rank_cd(m.tsv, q.q) DESC, m.seq DESC LIMIT $4"
)
VECTORS = "SELECT seq, embedding FROM memory WHERE ns = $1 AND collection = $2 ORDER BY seq"
INSERT_DOCUMENT = (
    f"INSERT INTO documents ({DOCUMENT_INSERT_COLS})"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
)
LIST_DOCUMENTS = (
    f"SELECT {DOCUMENT_COLS} FROM documents WHERE ns = $1"
    " AND ($2::text IS NULL OR collection = $2) ORDER BY seq"
)
DELETE_DOCUMENT = "DELETE FROM documents WHERE id = $1 AND ns = $2 AND collection = $3 RETURNING id"
_MINE = (
    "tenant = $1 AND owner = $2 AND scope IN (" + ", ".join(f"'{s}'" for s in PERSONAL_SCOPES) + ")"
)


def _count(tag: str) -> int:
    """The row count of a command tag such as ``DELETE 3``."""
    return int(tag.rsplit(" ", 1)[-1])


async def bump(conn: Conn, pairs: Iterable[Pair]) -> None:
    wanted = sorted(set(pairs))  # one order for every transaction: no deadlock between them
    if not wanted:
        return
    namespaces = [Namespace.from_key(key) for key, _ in wanted]
    await conn.execute(
        BUMP,
        [key for key, _ in wanted],
        [collection for _, collection in wanted],
        [ns.scope for ns in namespaces],
        [ns.tenant for ns in namespaces],
        [ns.owner for ns in namespaces],
    )


async def insert(conn: Conn, rows: Sequence[tuple[MemoryRecord, bytes]]) -> list[MemoryRecord]:
    if not rows:
        return []
    await bump(conn, {(r.namespace.key, r.collection) for r, _ in rows})
    columns = [list(c) for c in zip(*(record_values(r, e) for r, e in rows), strict=True)]
    try:
        got = await conn.fetch(INSERT_RECORDS, *columns)
    except asyncpg.UniqueViolationError as exc:
        raise Conflict("a memory record with this id exists") from exc
    seqs = {record_id: int(seq) for record_id, seq in got}
    return [replace(r, seq=seqs[r.id]) for r, _ in rows]


async def delete_where(conn: Conn, where: str, args: Sequence[Any]) -> int:
    """Delete the records matching ``where``, bumping the versions of what changed."""
    found = await conn.fetch(f"SELECT DISTINCT ns, collection FROM memory WHERE {where}", *args)
    seen = {(r[0], r[1]) for r in found}
    if not seen:
        return 0
    await bump(conn, seen)
    gone = await conn.fetch(
        f"WITH gone AS (DELETE FROM memory WHERE {where} RETURNING ns, collection)"
        " SELECT ns, collection, count(*) FROM gone GROUP BY ns, collection",
        *args,
    )
    # A record committed into a pair not seen above (between the two statements) is deleted
    # too: its version must move all the same.
    await bump(conn, {(r[0], r[1]) for r in gone} - seen)
    return sum(int(r[2]) for r in gone)


class PostgresRecall:
    """The record, search, document and forget methods of :class:`PostgresStore`."""

    if TYPE_CHECKING:

        def _conn(self) -> AbstractAsyncContextManager[Conn]: ...
        def _tx(self) -> AbstractAsyncContextManager[Conn]: ...

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
            collection = await conn.fetchval(COLLECTION_OF, record_id, ns.key)
            if collection is None:
                raise MemoryNotFound("memory not found")
            await bump(conn, [(ns.key, collection)])  # rolled back with the update if it fails
            # Conditional on the revision: of two updates naming the same one, the second
            # waits for the first's row lock, re-reads the row, and matches nothing.
            row = await conn.fetchrow(
                UPDATE_RECORD,
                record_id,
                ns.key,
                content,
                kind,
                bytes(embedding),
                now,
                expected_revision,
            )
            if row is None:
                current = await conn.fetchval(REVISION_OF, record_id, ns.key)
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
            row = await conn.fetchrow(RECORD_IN, record_id, [ns.key for ns in namespaces])
        return record_row(row) if row is not None else None

    async def locate_memory(self, record_id: str) -> Namespace | None:
        async with self._conn() as conn:
            key = await conn.fetchval(LOCATE, record_id)
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
            rows = await conn.fetch(LIST_RECORDS, keys, collection, after_seq, limit)
        return [record_row(r) for r in rows]

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        wanted = [int(s) for s in seqs]
        if not namespaces or not wanted:
            return []
        async with self._conn() as conn:
            rows = await conn.fetch(RECORDS_BY_SEQ, wanted, [ns.key for ns in namespaces])
        found = {r.seq: r for r in map(record_row, rows)}
        return [found[s] for s in dict.fromkeys(wanted) if s in found]

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool:
        async with self._tx() as conn:
            return await delete_where(conn, "id = $1 AND ns = $2", [record_id, ns.key]) == 1

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        async with self._tx() as conn:
            if collection is None:
                n = await delete_where(conn, "ns = $1", [ns.key])
                await conn.execute("DELETE FROM documents WHERE ns = $1", ns.key)
                return n
            args = [ns.key, collection]
            n = await delete_where(conn, "ns = $1 AND collection = $2", args)
            await conn.execute("DELETE FROM documents WHERE ns = $1 AND collection = $2", *args)
            return n

    async def delete_turn_memory(
        self, namespaces: Sequence[Namespace], turn_id: str, author: str
    ) -> int:
        if not namespaces:
            return 0
        where = "turn_id = $1 AND author = $2 AND ns = ANY($3::text[])"
        async with self._tx() as conn:
            return await delete_where(conn, where, [turn_id, author, [n.key for n in namespaces]])

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        words = list(dict.fromkeys(t for t in terms if t.strip()))
        if not namespaces or not words or limit <= 0:
            return []
        keys = [ns.key for ns in namespaces]
        async with self._conn() as conn:
            rows = await conn.fetch(LEXICAL_SEARCH, words, keys, collection, limit)
        return [int(r[0]) for r in rows]

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        async with self._conn() as conn:
            version = await conn.fetchval(VERSION, ns.key, collection)
        return int(version) if version is not None else 0

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        keys = [ns.key for ns in namespaces]
        if not keys:
            return []
        async with self._conn() as conn:
            rows = await conn.fetch(
                "SELECT ns, version FROM memory_versions"
                " WHERE collection = $1 AND ns = ANY($2::text[])",
                collection,
                keys,
            )
        found = {str(r[0]): int(r[1]) for r in rows}
        return [found.get(k, 0) for k in keys]

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot:
        # REPEATABLE READ: the version and the vectors come from one snapshot, so a cache keyed
        # by that version holds exactly these vectors.
        async with self._conn() as conn, conn.transaction(isolation="repeatable_read"):
            version = await conn.fetchval(VERSION, ns.key, collection)
            rows = await conn.fetch(VECTORS, ns.key, collection)
        return VectorSnapshot(
            int(version) if version is not None else 0,
            [int(r[0]) for r in rows],
            [bytes(r[1]) for r in rows],
        )

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        rows = document_chunks(document, chunks)
        async with self._tx() as conn:
            try:
                await conn.execute(INSERT_DOCUMENT, *document_values(document))
            except asyncpg.UniqueViolationError as exc:
                raise Conflict(f"a document with id {document.id!r} exists") from exc
            await insert(conn, rows)
        return document

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]:
        async with self._conn() as conn:
            rows = await conn.fetch(LIST_DOCUMENTS, ns.key, collection)
        return [document_row(r) for r in rows]

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        args = [document_id, ns.key, collection]
        async with self._tx() as conn:
            await delete_where(conn, "document_id = $1 AND ns = $2 AND collection = $3", args)
            return await conn.fetchval(DELETE_DOCUMENT, *args) is not None

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        async with self._tx() as conn:
            # Items, turns and events go with their sessions (ON DELETE CASCADE).
            tag = await conn.execute(
                "DELETE FROM sessions WHERE tenant = $1 AND owner = $2", tenant, user
            )
            sessions = _count(tag)
            # Version rows before records (the lock order of every memory write). Deleted, not
            # bumped: no row reads as version 0, "nothing here", which is now true, and the
            # clock gives any later write a version never handed out before.
            await conn.execute(f"DELETE FROM memory_versions WHERE {_MINE}", tenant, user)
            memory = _count(await conn.execute(f"DELETE FROM memory WHERE {_MINE}", tenant, user))
            tag = await conn.execute(f"DELETE FROM documents WHERE {_MINE}", tenant, user)
        return ForgetReport(sessions=sessions, memory=memory, documents=_count(tag))
