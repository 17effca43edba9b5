"""The steps the SQLite store's memory transactions share: versions, inserts, deletions.

Every write to a record keeps the FTS5 index and the version of its (namespace, collection) in
step, in the caller's transaction: a reader never sees a record without its index entry, nor a
version that does not describe the vectors it reads with it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from tether.errors import Conflict
from tether.records import MemoryRecord, MemoryWrites, Namespace, SessionKey
from tether.store.rows import record_values
from tether.store.rules import CONVERSATION_AUTHORS, search_terms
from tether.store.sqlite import recall_queries as q

T = TypeVar("T")
Pair = tuple[str, str]
"""``(namespace key, collection)``: what a version counts the changes of."""

changed = [0]
"""How many times this process has changed a version row (any store, any connection): bumped
in the transaction that does, before it commits, so a version read cached under an older count
is known to be stale (:meth:`~tether.store.sqlite.recall.Recall.vector_versions`). A change
rolled back after all counts too, which costs a read, never a stale answer."""


def versions_changed() -> None:
    changed[0] += 1


def fts_query(terms: Sequence[str]) -> str:
    """An FTS5 query matching any of ``terms``. Each is quoted (``"`` doubled inside), so
    nothing in a term is read as FTS5 syntax (``NEAR``, ``AND``, ``*``, ``:``, ``-``, ``^``…)."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in search_terms(terms))


def bump(c: sqlite3.Connection, pairs: Iterable[Pair]) -> None:
    wanted = sorted(set(pairs))
    if not wanted:
        return
    versions_changed()
    (version,) = c.execute(q.BUMP_CLOCK).fetchone()
    rows = []
    for key, collection in wanted:
        ns = Namespace.from_key(key)
        rows.append((key, collection, ns.scope, ns.tenant, ns.owner, version))
    c.executemany(q.SET_VERSION, rows)


def version(c: sqlite3.Connection, ns: Namespace, collection: str) -> int:
    row = c.execute(q.VERSION, (ns.key, collection)).fetchone()
    return int(row[0]) if row else 0


def insert(c: sqlite3.Connection, rows: Sequence[tuple[MemoryRecord, bytes]]) -> list[MemoryRecord]:
    out = []
    for record, embedding in rows:
        try:
            (seq,) = c.execute(q.INSERT_RECORD, record_values(record, embedding)).fetchone()
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"a memory record with id {record.id!r} exists") from exc
        c.execute(q.INDEX_TEXT, (seq, record.content))
        out.append(replace(record, seq=int(seq)))
    bump(c, ((r.namespace.key, r.collection) for r in out))
    return out


def delete_where(c: sqlite3.Connection, where: str, args: Sequence[Any], *, versions: bool) -> int:
    """Delete the records matching ``where``, with their index entries; bump the versions of
    what changed unless ``versions`` is False (the caller deletes those version rows)."""
    pairs = c.execute(q.PAIRS_WHERE.format(where=where), args).fetchall()
    if not pairs:
        return 0
    c.execute(q.UNINDEX_WHERE.format(where=where), args)
    n = c.execute(q.DELETE_WHERE.format(where=where), args).rowcount
    if versions:
        bump(c, pairs)
    return int(n)


def drop_session_memory(c: sqlite3.Connection, key: SessionKey) -> int:
    """Delete everything of the session's own scope: records, documents, versions."""
    ns = Namespace.session(key).key
    n = delete_where(c, q.WHERE_NAMESPACE, (ns,), versions=False)
    c.execute(q.DELETE_NAMESPACE_DOCUMENTS, (ns,))
    versions_changed()
    c.execute(q.DELETE_NAMESPACE_VERSIONS, (ns,))
    return n


def drop_conversation_memory(c: sqlite3.Connection, key: SessionKey) -> int:
    """Delete the session-scope memory its turns wrote (the history it came from is cleared)."""
    args = (Namespace.session(key).key, *CONVERSATION_AUTHORS)
    return delete_where(c, q.WHERE_AUTHORS, args, versions=True)


def apply_writes(c: sqlite3.Connection, writes: MemoryWrites) -> None:
    for ns, record_id in writes.delete:
        delete_where(c, q.WHERE_RECORD, (record_id, ns.key), versions=True)
    if writes.put:
        insert(c, writes.put)


def read_snapshot(c: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run the reads of ``fn`` in one transaction: one snapshot, whatever another process
    commits meanwhile (a SAVEPOINT nests inside the write batch the call may be part of)."""
    c.execute("SAVEPOINT snapshot")
    try:
        return fn(c)
    finally:
        c.execute("RELEASE snapshot")
