"""The memory and knowledge half of the SQLite store (:class:`~tether.store.recall.RecallStore`).

Like the rest of the store, each method is one function run on the store's thread; a write is
one transaction (``BEGIN IMMEDIATE``, so every check it makes holds until it commits, across
processes too). Every write to a record keeps the FTS5 index and the version of its
(namespace, collection) in step, in that same transaction: a reader never sees a record without
its index entry, nor a version that does not describe the vectors it reads with it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from tether.errors import Conflict, MemoryNotFound, RevisionConflict
from tether.records import Document, ForgetReport, MemoryRecord, Namespace, VectorSnapshot
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
from tether.store.rules import PERSONAL_SCOPES, document_chunks, search_terms

T = TypeVar("T")
Pair = tuple[str, str]
"""``(namespace key, collection)``: what a version counts the changes of."""

_PERSONAL = "scope IN (" + ", ".join(f"'{s}'" for s in PERSONAL_SCOPES) + ")"


def _marks(n: int) -> str:
    return ",".join("?" * n)


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 query matching any of ``terms``. Each is quoted (``"`` doubled inside), so
    nothing in a term is read as FTS5 syntax (``NEAR``, ``AND``, ``*``, ``:``, ``-``, ``^``…)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in search_terms(terms))


def bump(c: sqlite3.Connection, pairs: Iterable[Pair]) -> None:
    wanted = sorted(set(pairs))
    if not wanted:
        return
    (version,) = c.execute("UPDATE memory_clock SET value = value + 1 RETURNING value").fetchone()
    rows = []
    for key, collection in wanted:
        ns = Namespace.from_key(key)
        rows.append((key, collection, ns.scope, ns.tenant, ns.owner, version))
    c.executemany(
        "INSERT INTO memory_versions (ns, collection, scope, tenant, owner, version)"
        " VALUES (?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (ns, collection) DO UPDATE SET version = excluded.version",
        rows,
    )


def insert(c: sqlite3.Connection, rows: Sequence[tuple[MemoryRecord, bytes]]) -> list[MemoryRecord]:
    out = []
    for record, embedding in rows:
        try:
            (seq,) = c.execute(
                f"INSERT INTO memory ({INSERT_COLS}) VALUES ({_marks(16)}) RETURNING seq",
                record_values(record, embedding),
            ).fetchone()
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"a memory record with id {record.id!r} exists") from exc
        c.execute("INSERT INTO memory_fts (rowid, content) VALUES (?, ?)", (seq, record.content))
        out.append(replace(record, seq=int(seq)))
    bump(c, ((r.namespace.key, r.collection) for r in out))
    return out


def delete_where(c: sqlite3.Connection, where: str, args: Sequence[Any], *, versions: bool) -> int:
    """Delete the records matching ``where``, with their index entries; bump the versions of
    what changed unless ``versions`` is False (the caller deletes those version rows)."""
    pairs = c.execute(f"SELECT DISTINCT ns, collection FROM memory WHERE {where}", args).fetchall()
    if not pairs:
        return 0
    # An external-content index forgets a row only when told its exact old text.
    c.execute(
        "INSERT INTO memory_fts (memory_fts, rowid, content)"
        f" SELECT 'delete', seq, content FROM memory WHERE {where}",
        args,
    )
    n = c.execute(f"DELETE FROM memory WHERE {where}", args).rowcount
    if versions:
        bump(c, pairs)
    return int(n)


def read_snapshot(c: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run the reads of ``fn`` in one transaction: one snapshot, whatever another process
    commits meanwhile (a SAVEPOINT nests inside the write batch the call may be part of)."""
    c.execute("SAVEPOINT snapshot")
    try:
        return fn(c)
    finally:
        c.execute("RELEASE snapshot")


class SQLiteRecall:
    """The record, search, document and forget methods of :class:`SQLiteStore`."""

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

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
            row = c.execute(
                "SELECT seq, revision, collection, content FROM memory WHERE id = ? AND ns = ?",
                (record_id, ns.key),
            ).fetchone()
            if row is None:
                raise MemoryNotFound("memory not found")
            seq, revision, collection, old = row
            if revision != expected_revision:
                raise RevisionConflict(
                    f"memory revision is {revision}, not {expected_revision}",
                    current_revision=int(revision),
                )
            c.execute(
                "INSERT INTO memory_fts (memory_fts, rowid, content) VALUES ('delete', ?, ?)",
                (seq, old),
            )
            new = c.execute(
                "UPDATE memory SET content = ?, kind = ?, embedding = ?, updated_at = ?,"
                f" revision = revision + 1 WHERE seq = ? RETURNING {RECORD_COLS}",
                (content, kind, bytes(embedding), now, seq),
            ).fetchone()
            c.execute("INSERT INTO memory_fts (rowid, content) VALUES (?, ?)", (seq, content))
            bump(c, [(ns.key, collection)])
            return record_row(new)

        return await self._write(do)

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None:
        return await self.find_memory([ns], record_id)

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        keys = [ns.key for ns in namespaces]

        def do(c: sqlite3.Connection) -> MemoryRecord | None:
            row = c.execute(
                f"SELECT {RECORD_COLS} FROM memory WHERE id = ? AND ns IN ({_marks(len(keys))})",
                (record_id, *keys),
            ).fetchone()
            return record_row(row) if row else None

        return await self._run(do) if keys else None

    async def locate_memory(self, record_id: str) -> Namespace | None:
        def do(c: sqlite3.Connection) -> Namespace | None:
            row = c.execute("SELECT ns FROM memory WHERE id = ?", (record_id,)).fetchone()
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

        def do(c: sqlite3.Connection) -> list[MemoryRecord]:
            rows = c.execute(
                f"SELECT {RECORD_COLS} FROM memory WHERE ns IN ({_marks(len(keys))})"
                " AND collection = ? AND seq > ? ORDER BY seq LIMIT ?",
                (*keys, collection, after_seq, limit),
            ).fetchall()
            return [record_row(r) for r in rows]

        return await self._run(do) if keys and limit > 0 else []

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        keys, wanted = [ns.key for ns in namespaces], [int(s) for s in seqs]

        def do(c: sqlite3.Connection) -> list[MemoryRecord]:
            # json_each: any number of seqs in one parameter, whatever SQLite's variable limit.
            rows = c.execute(
                f"SELECT {RECORD_COLS} FROM memory WHERE seq IN (SELECT value FROM json_each(?))"
                f" AND +ns IN ({_marks(len(keys))})",  # "+": look up by seq, not scan the ns index
                (json.dumps(wanted), *keys),
            ).fetchall()
            found = {r.seq: r for r in map(record_row, rows)}
            return [found[s] for s in dict.fromkeys(wanted) if s in found]

        return await self._run(do) if keys and wanted else []

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool:
        where, args = "id = ? AND ns = ?", (record_id, ns.key)
        return await self._write(lambda c: delete_where(c, where, args, versions=True)) == 1

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        def do(c: sqlite3.Connection) -> int:
            if collection is None:
                n = delete_where(c, "ns = ?", (ns.key,), versions=True)
                c.execute("DELETE FROM documents WHERE ns = ?", (ns.key,))
                return n
            args = (ns.key, collection)
            n = delete_where(c, "ns = ? AND collection = ?", args, versions=True)
            c.execute("DELETE FROM documents WHERE ns = ? AND collection = ?", args)
            return n

        return await self._write(do)

    async def delete_turn_memory(
        self, namespaces: Sequence[Namespace], turn_id: str, author: str
    ) -> int:
        keys = [ns.key for ns in namespaces]
        where = f"turn_id = ? AND author = ? AND ns IN ({_marks(len(keys))})"
        args = (turn_id, author, *keys)
        if not keys:
            return 0
        return await self._write(lambda c: delete_where(c, where, args, versions=True))

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

        def do(c: sqlite3.Connection) -> list[int]:
            # bm25 is smaller for better matches; among equals the newer record goes first.
            rows = c.execute(
                "SELECT m.seq FROM memory_fts JOIN memory m ON m.seq = memory_fts.rowid"
                f" WHERE memory_fts MATCH ? AND m.ns IN ({_marks(len(keys))})"
                " AND m.collection = ? ORDER BY bm25(memory_fts), m.seq DESC LIMIT ?",
                (query, *keys, collection, limit),
            ).fetchall()
            return [int(r[0]) for r in rows]

        return await self._run(do) if keys and query and limit > 0 else []

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        return await self._run(lambda c: _version(c, ns, collection))

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        keys = [ns.key for ns in namespaces]
        if not keys:
            return []

        def read(c: sqlite3.Connection) -> list[int]:
            marks = ",".join("?" * len(keys))
            rows = c.execute(
                f"SELECT ns, version FROM memory_versions WHERE collection = ? AND ns IN ({marks})",
                (collection, *keys),
            ).fetchall()
            found = {str(r[0]): int(r[1]) for r in rows}
            return [found.get(k, 0) for k in keys]

        return await self._run(read)

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot:
        def read(c: sqlite3.Connection) -> VectorSnapshot:
            version = _version(c, ns, collection)
            rows = c.execute(
                "SELECT seq, embedding FROM memory WHERE ns = ? AND collection = ? ORDER BY seq",
                (ns.key, collection),
            ).fetchall()
            return VectorSnapshot(version, [int(r[0]) for r in rows], [r[1] for r in rows])

        return await self._run(lambda c: read_snapshot(c, read))

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        rows = document_chunks(document, chunks)

        def do(c: sqlite3.Connection) -> Document:
            try:
                c.execute(
                    f"INSERT INTO documents ({DOCUMENT_INSERT_COLS}) VALUES ({_marks(12)})",
                    document_values(document),
                )
            except sqlite3.IntegrityError as exc:
                raise Conflict(f"a document with id {document.id!r} exists") from exc
            insert(c, rows)
            return document

        return await self._write(do)

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]:
        def do(c: sqlite3.Connection) -> list[Document]:
            rows = c.execute(
                f"SELECT {DOCUMENT_COLS} FROM documents WHERE ns = ?"
                " AND (? IS NULL OR collection = ?) ORDER BY seq",
                (ns.key, collection, collection),
            ).fetchall()
            return [document_row(r) for r in rows]

        return await self._run(do)

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        def do(c: sqlite3.Connection) -> bool:
            args = (document_id, ns.key, collection)
            delete_where(c, "document_id = ? AND ns = ? AND collection = ?", args, versions=True)
            gone = c.execute(
                "DELETE FROM documents WHERE id = ? AND ns = ? AND collection = ?", args
            ).rowcount
            return gone == 1

        return await self._write(do)

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        def do(c: sqlite3.Connection) -> ForgetReport:
            # Forgetting means no trace in the file either: freed cells and pages are zeroed
            # (secure_delete), and the full-text index, which keeps deleted terms in its older
            # segments until they merge, is merged now.
            c.execute("PRAGMA secure_delete=ON")
            try:
                return forget(c)
            finally:
                c.execute("PRAGMA secure_delete=OFF")

        def forget(c: sqlite3.Connection) -> ForgetReport:
            args = (tenant, user)
            # Items, turns and events go with their sessions (ON DELETE CASCADE).
            sessions = c.execute(
                "DELETE FROM sessions WHERE tenant = ? AND owner = ?", args
            ).rowcount
            mine = f"tenant = ? AND owner = ? AND {_PERSONAL}"
            memory = delete_where(c, mine, args, versions=False)
            documents = c.execute(f"DELETE FROM documents WHERE {mine}", args).rowcount
            # Deleted, not bumped: no row reads as version 0, "nothing here", which is now
            # true, and the clock gives any later write a version never seen before.
            c.execute(f"DELETE FROM memory_versions WHERE {mine}", args)
            c.execute("INSERT INTO memory_fts(memory_fts) VALUES ('optimize')")
            return ForgetReport(sessions=sessions, memory=memory, documents=documents)

        report = await self._write(do)
        # The old page images may still sit in the write-ahead log: fold it into the file and
        # empty it (best effort: a reader holding a snapshot defers it to a later checkpoint).
        await self._run(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall())
        return report


def _version(c: sqlite3.Connection, ns: Namespace, collection: str) -> int:
    row = c.execute(
        "SELECT version FROM memory_versions WHERE ns = ? AND collection = ?",
        (ns.key, collection),
    ).fetchone()
    return int(row[0]) if row else 0
