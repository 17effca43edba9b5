"""Row shapes of the SQL backends: SQLite and PostgreSQL read the same columns in the same order
(``*_COLS``), so both return the very same records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tether.events import MESSAGE_DELTA
from tether.records import (
    AgentRef,
    ApiKey,
    CancelStatus,
    Decision,
    Document,
    Event,
    Item,
    MemoryRecord,
    Namespace,
    NewEvent,
    Reason,
    SessionKey,
    SessionRecord,
    Turn,
    Usage,
)
from tether.store.rules import cancel_request, provenance, usage_data


# -- rows of the SQL backends (same column order in SQLite and PostgreSQL) ----------------
def session_row(row: Sequence[Any]) -> SessionRecord:
    return SessionRecord(
        key=SessionKey(row[0], row[1], row[2]),
        agent=row[3],
        metadata=json.loads(row[4]),
        state=json.loads(row[5]),
        created_at=row[6],
        updated_at=row[7],
        expires_at=row[8],
        revision=row[9],
    )


def turn_row(row: tuple[Any, ...]) -> Turn:
    u = json.loads(row[12])
    return Turn(
        id=row[0],
        key=SessionKey(row[1], row[2], row[3]),
        seq=row[4],
        input=row[5],
        policy=row[6],
        status=row[7],
        reason=row[8],
        error=row[9],
        output=row[10],
        complete=bool(row[11]),
        usage=Usage(u.get("input_tokens", 0), u.get("output_tokens", 0), u.get("model_calls", 0)),
        created_at=row[13],
        started_at=row[14],
        ended_at=row[15],
        agent=AgentRef(row[16], row[17] or "") if row[16] is not None else None,
        ran_by=row[18],
    )


def item_row(row: tuple[Any, ...]) -> Item:
    return Item(
        seq=row[0],
        turn_id=row[1],
        kind=row[2],
        content=row[3],
        complete=bool(row[4]),
        call_id=row[5],
        tool_name=row[6],
        arguments=row[7],
        meta=json.loads(row[8]),
        created_at=row[9],
        excluded=bool(row[10]),
    )


def key_args(key: SessionKey) -> tuple[str, str, str]:
    """A session key as the three values of a statement's ``KEY_WHERE``."""
    return key.tenant, key.owner, key.session_id


def usage_json(u: Usage) -> str:
    return json.dumps(usage_data(u))


def event_rows(events: Sequence[NewEvent]) -> list[tuple[int, int | None, str, str]]:
    """``(seq, last_seq, type, data)`` rows: consecutive text deltas are folded into one row.

    A streamed reply is hundreds of one-word events; storing them as one row per commit keeps
    the cost of streaming off the write path while every event keeps its own seq for resume.
    """
    rows: list[tuple[int, int | None, str, str]] = []
    run: list[NewEvent] = []

    def flush() -> None:
        if len(run) == 1:
            rows.append((run[0].seq, None, run[0].type, json.dumps(run[0].data)))
        elif run:
            texts = [e.data.get("text", "") for e in run]
            rows.append((run[0].seq, run[-1].seq, MESSAGE_DELTA, json.dumps({"texts": texts})))
        run.clear()

    for e in events:
        foldable = e.type == MESSAGE_DELTA and set(e.data) == {"text"}
        if foldable and (not run or run[-1].seq + 1 == e.seq):
            run.append(e)
            continue
        flush()
        if foldable:
            run.append(e)
        else:
            rows.append((e.seq, None, e.type, json.dumps(e.data)))
    flush()
    return rows


def events_of(
    turn_id: str, rows: Sequence[Sequence[Any]], after_seq: int, limit: int
) -> list[Event]:
    """The events of ``(seq, last_seq, type, data, created_at)`` rows, a folded run of text
    deltas unfolded into one event per seq, those after ``after_seq``, at most ``limit``."""
    out: list[Event] = []
    for seq, last_seq, type_, data, created in rows:
        if last_seq is None:
            out.append(Event(turn_id, seq, type_, json.loads(data), created))
            continue
        for offset, text in enumerate(json.loads(data)["texts"]):
            if seq + offset > after_seq:
                out.append(Event(turn_id, seq + offset, type_, {"text": text}, created))
    return out[:limit]


DECISION_COLS = (
    "turn_id, call_id, kind, payload, status, created_at, deadline, answer, decided_by, decided_at"
)
JOINED_DECISION_COLS = ", ".join("d." + c.strip() for c in DECISION_COLS.split(","))
"""``DECISION_COLS`` of the table aliased ``d``, in a join."""


def decision_row(key: SessionKey, row: Sequence[Any]) -> Decision:
    """A decision of the session ``key`` (its rows hold the session's pk, not its key)."""
    return Decision(
        key=key,
        turn_id=row[0],
        call_id=row[1],
        kind=row[2],
        payload=json.loads(row[3]),
        status=row[4],
        created_at=float(row[5]),
        deadline=float(row[6]),
        answer=row[7],
        decided_by=row[8],
        decided_at=float(row[9]) if row[9] is not None else None,
    )


def decision_values(d: Decision) -> tuple[Any, ...]:
    """The values of ``d`` in the order of ``DECISION_COLS``."""
    return (
        d.turn_id,
        d.call_id,
        d.kind,
        json.dumps(d.payload),
        d.status,
        d.created_at,
        d.deadline,
        d.answer,
        d.decided_by,
        d.decided_at,
    )


# -- memory tables -----------------------------------------------------------------------------
RECORD_COLS = (
    "seq, id, ns, collection, document_id, kind, content, meta, revision, created_at, updated_at"
)
DOCUMENT_COLS = "id, ns, collection, name, media_type, chunks, chars, created_at, meta"


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


API_KEY_COLS = "id, tenant, user_id, roles, hash, created_at, revoked_at"


def api_key_row(row: Sequence[Any]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(json.loads(row[3])), row[4], row[5], row[6])


def cancel_json(status: CancelStatus, reason: Reason) -> str:
    return json.dumps({"status": status, "reason": reason})


def cancel_of(raw: str) -> tuple[CancelStatus, Reason]:
    """A stored cancel request; one that cannot be read still cancels (never blocks others)."""
    try:
        request = json.loads(raw)
        status, reason = request.get("status"), request.get("reason")
    except (ValueError, AttributeError):
        status = reason = None
    return cancel_request(status, reason)
