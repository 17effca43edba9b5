"""Record shapes shared by every store backend."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from tether.records import Item, SessionKey, SessionRecord, Turn, TurnEnding, Usage
from tether.store.base import NewEvent


def terminal_event_data(turn_id: str, ending: TurnEnding) -> dict[str, Any]:
    """The body of a ``turn.ended`` event; one shape for every writer of it."""
    return {
        "turn_id": turn_id,
        "status": ending.status,
        "reason": ending.reason,
        "output": ending.output,
        "complete": ending.complete,
        "error": ending.error,
        "usage": {
            "input_tokens": ending.usage.input_tokens,
            "output_tokens": ending.usage.output_tokens,
            "model_calls": ending.usage.model_calls,
        },
    }


# -- rows of the SQL backends (same column order in SQLite and PostgreSQL) ----------------
def session_row(row: sqlite3.Row | tuple[Any, ...]) -> SessionRecord:
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


def usage_json(u: Usage) -> str:
    return json.dumps(
        {
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "model_calls": u.model_calls,
        }
    )


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
            rows.append((run[0].seq, run[-1].seq, "message.delta", json.dumps({"texts": texts})))
        run.clear()

    for e in events:
        foldable = e.type == "message.delta" and set(e.data) == {"text"}
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
