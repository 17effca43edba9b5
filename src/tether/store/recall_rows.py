"""Record shapes of the memory tables, shared by every store backend.

The SQL backends read the same columns in the same order (``RECORD_COLS``, ``DOCUMENT_COLS``),
so SQLite and PostgreSQL return the very same records; the checks of a document's chunks are
here too, so that all three backends refuse the same inputs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tether.errors import InvalidInput
from tether.memory.records import Document, MemoryRecord, Namespace

RECORD_COLS = (
    "seq, id, ns, collection, document_id, kind, content, meta, revision, created_at, updated_at"
)
DOCUMENT_COLS = "id, ns, collection, name, media_type, chunks, chars, created_at, meta"
PERSONAL_SCOPES = ("session", "user")
"""The scopes a user's data lives in: what ``forget_user`` deletes (agent and tenant stay)."""

# The English stop words of Snowball, the list PostgreSQL's 'english' configuration drops from
# every query. SQLite and the memory store drop them too: all backends then agree that "the"
# matches nothing, and in SQLite, whose FTS5 has no stop list, such a word would otherwise
# match nearly every record and make one search score them all.
_SNOWBALL_ENGLISH = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what
    which who whom this that these those am is are was were be been being have has had
    having do does did doing a an the and but if or because as until while of at by for
    with about against between into through during before after above below to from up
    down in out on off over under again further then once here there when where why how
    all any both each few more most other some such no nor not only own same so than too
    very s t can will just don should now
"""
STOP_WORDS = frozenset(_SNOWBALL_ENGLISH.split())


def search_terms(terms: Sequence[str]) -> list[str]:
    """The terms worth searching for: without blanks and stop words, each once."""
    return list(dict.fromkeys(t for t in terms if t.strip() and t.lower() not in STOP_WORDS))


def record_row(row: Sequence[Any]) -> MemoryRecord:
    return MemoryRecord(
        id=row[1],
        namespace=Namespace.from_key(row[2]),
        kind=row[5],
        content=row[6],
        collection=row[3],
        document_id=row[4],
        meta=json.loads(row[7]),
        revision=int(row[8]),
        # float(): SQLite's RETURNING gives a value before the column's REAL affinity applies.
        created_at=float(row[9]),
        updated_at=float(row[10]),
        seq=int(row[0]),
    )


def document_row(row: Sequence[Any]) -> Document:
    return Document(
        id=row[0],
        namespace=Namespace.from_key(row[1]),
        collection=row[2],
        name=row[3],
        media_type=row[4],
        chunks=int(row[5]),
        chars=int(row[6]),
        created_at=float(row[7]),
        meta=json.loads(row[8]),
    )


def provenance(record: MemoryRecord) -> tuple[str | None, str | None]:
    """``(turn_id, author)`` from the record's meta: the columns ``delete_turn_memory`` finds
    a rolled-back turn's notes by."""
    turn_id, author = record.meta.get("turn_id"), record.meta.get("author")
    return (
        str(turn_id) if turn_id is not None else None,
        str(author) if author is not None else None,
    )


def record_values(record: MemoryRecord, embedding: bytes) -> tuple[Any, ...]:
    """The insert values of ``record``, in the order of ``INSERT_COLS``."""
    ns = record.namespace
    turn_id, author = provenance(record)
    return (
        record.id,
        ns.key,
        ns.scope,
        ns.tenant,
        ns.owner,
        record.collection,
        record.document_id,
        record.kind,
        record.content,
        json.dumps(record.meta),
        turn_id,
        author,
        record.revision,
        record.created_at,
        record.updated_at,
        bytes(embedding),
    )


INSERT_COLS = (
    "id, ns, scope, tenant, owner, collection, document_id, kind, content, meta, turn_id,"
    " author, revision, created_at, updated_at, embedding"
)


def document_values(document: Document) -> tuple[Any, ...]:
    """The insert values of ``document``, in the order of ``DOCUMENT_INSERT_COLS``."""
    ns = document.namespace
    return (
        document.id,
        ns.key,
        ns.scope,
        ns.tenant,
        ns.owner,
        document.collection,
        document.name,
        document.media_type,
        document.chunks,
        document.chars,
        document.created_at,
        json.dumps(document.meta),
    )


DOCUMENT_INSERT_COLS = (
    "id, ns, scope, tenant, owner, collection, name, media_type, chunks, chars, created_at, meta"
)


def document_chunks(
    document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
) -> list[tuple[MemoryRecord, bytes]]:
    """The chunks as stored: each names the document (filled in when it is None).

    A chunk outside its document's namespace or collection is refused rather than stored
    where its document is not: deleting or forgetting the document would leave it behind.
    """
    if not document.collection:
        raise InvalidInput("a document belongs to a named collection ('' holds memory items)")
    out = []
    for record, embedding in chunks:
        if record.namespace != document.namespace or record.collection != document.collection:
            raise InvalidInput(f"chunk {record.id} is not in its document's namespace/collection")
        if record.document_id not in (None, document.id):
            raise InvalidInput(f"chunk {record.id} belongs to document {record.document_id}")
        out.append((replace(record, document_id=document.id), embedding))
    return out
