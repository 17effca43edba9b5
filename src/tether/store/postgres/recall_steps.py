"""The steps the PostgreSQL store's memory transactions share: versions, inserts, deletions.

Lock order, so memory writes cannot deadlock one another: every write first takes the version
rows of the pairs it changes (an upsert, in sorted order), then touches records.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from tether.errors import Conflict
from tether.records import MemoryRecord, MemoryWrites, Namespace, SessionKey
from tether.store.postgres import recall_queries as q
from tether.store.postgres.steps import Conn
from tether.store.rows import record_values
from tether.store.rules import CONVERSATION_AUTHORS

Pair = tuple[str, str]
"""``(namespace key, collection)``: what a version counts the changes of."""


async def bump(conn: Conn, pairs: Iterable[Pair]) -> None:
    wanted = sorted(set(pairs))  # one order for every transaction: no deadlock between them
    if not wanted:
        return
    namespaces = [Namespace.from_key(key) for key, _ in wanted]
    await conn.execute(
        q.BUMP,
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
        got = await conn.fetch(q.INSERT_RECORDS, *columns)
    except asyncpg.UniqueViolationError as exc:
        raise Conflict("a memory record with this id exists") from exc
    seqs = {record_id: int(seq) for record_id, seq in got}
    return [replace(r, seq=seqs[r.id]) for r, _ in rows]


async def delete_where(conn: Conn, where: str, args: Sequence[Any]) -> int:
    """Delete the records matching ``where``, bumping the versions of what changed."""
    found = await conn.fetch(q.PAIRS_WHERE.format(where=where), *args)
    seen = {(r[0], r[1]) for r in found}
    if not seen:
        return 0
    await bump(conn, seen)
    gone = await conn.fetch(q.DELETE_WHERE.format(where=where), *args)
    # A record committed into a pair not seen above (between the two statements) is deleted
    # too: its version must move all the same.
    await bump(conn, {(r[0], r[1]) for r in gone} - seen)
    return sum(int(r[2]) for r in gone)


async def drop_session_memory(conn: Conn, key: SessionKey) -> int:
    """Delete everything of the session's own scope: records, documents, versions."""
    ns = Namespace.session(key).key
    n = await delete_where(conn, q.WHERE_NAMESPACE, [ns])
    await conn.execute(q.DELETE_NAMESPACE_DOCUMENTS, ns)
    await conn.execute(q.DELETE_NAMESPACE_VERSIONS, ns)
    return n


async def drop_conversation_memory(conn: Conn, key: SessionKey) -> int:
    """Delete the session-scope memory its turns wrote (the history it came from is cleared)."""
    return await delete_where(
        conn, q.WHERE_AUTHORS, [Namespace.session(key).key, list(CONVERSATION_AUTHORS)]
    )


async def apply_writes(conn: Conn, writes: MemoryWrites) -> None:
    for ns, record_id in writes.delete:
        await delete_where(conn, q.WHERE_RECORD, [record_id, ns.key])
    await insert(conn, writes.put)
