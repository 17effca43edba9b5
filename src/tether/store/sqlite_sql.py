"""SQL of the SQLite store: column lists and the row-level steps its transactions share.

Every function takes the connection of the store's writer thread and runs inside the
transaction its caller is in; none of them commits, except ``migrate``, which owns its own.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from tether.errors import Conflict, SessionBusy, SessionNotFound, StaleLease
from tether.records import ApiKey, Item, Lease, NewEvent, NewItem, SessionKey, Turn, TurnEnding
from tether.store.rows import event_rows, turn_row, usage_json
from tether.store.rules import terminal_event_data
from tether.store.sqlite_schema import MIGRATIONS

SESSION_COLS = (
    "tenant, owner, session_id, agent, metadata, state, created_at, updated_at, expires_at,"
    " revision"
)
TURN_COLS = (
    "t.id, s.tenant, s.owner, s.session_id, t.seq, t.input, t.policy, t.status, t.reason,"
    " t.error, t.output, t.complete, t.usage, t.created_at, t.started_at, t.ended_at"
)
ITEM_COLS = (
    "seq, turn_id, kind, content, complete, call_id, tool_name, arguments, meta, created_at,"
    " excluded"
)
KEY_WHERE = "tenant = ? AND owner = ? AND session_id = ?"


def statements(sql: str) -> list[str]:
    """Split a migration into statements; ``--`` comments go first (they may hold a ';')."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [st.strip() for st in "\n".join(lines).split(";") if st.strip()]


def migrate(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        current = row[0] or 0
        for version, sql in MIGRATIONS:
            if version > current:
                for statement in statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def session_pk(conn: sqlite3.Connection, key: SessionKey) -> int:
    row = conn.execute(
        f"SELECT pk FROM sessions WHERE {KEY_WHERE}", (key.tenant, key.owner, key.session_id)
    ).fetchone()
    if row is None:
        raise SessionNotFound("session not found")
    return int(row[0])


def fenced_pk(conn: sqlite3.Connection, lease: Lease) -> int:
    # Runs inside BEGIN IMMEDIATE: nobody can move the token between this read and the
    # writes that follow in the same transaction.
    k = lease.key
    row = conn.execute(
        f"SELECT pk, lease_token FROM sessions WHERE {KEY_WHERE}",
        (k.tenant, k.owner, k.session_id),
    ).fetchone()
    if row is None:
        raise SessionNotFound("session not found")
    if row[1] != lease.token:
        raise StaleLease(f"lease token {lease.token} is stale (current {row[1]})")
    return int(row[0])


def raise_if_active(c: sqlite3.Connection, pk: int) -> None:
    row = c.execute(
        "SELECT id FROM turns WHERE session_pk = ? AND status IN ('queued', 'running')"
        " ORDER BY seq LIMIT 1",
        (pk,),
    ).fetchone()
    if row is not None:
        raise SessionBusy("a turn is queued or running", busy_turn_id=row[0])


def get_turn(c: sqlite3.Connection, pk: int, turn_id: str) -> Turn | None:
    row = c.execute(
        f"SELECT {TURN_COLS} FROM turns t JOIN sessions s ON s.pk = t.session_pk"
        " WHERE t.id = ? AND t.session_pk = ?",
        (turn_id, pk),
    ).fetchone()
    return turn_row(row) if row else None


def add_rows(
    c: sqlite3.Connection,
    pk: int,
    turn_id: str,
    items: Sequence[NewItem],
    events: Sequence[NewEvent],
) -> list[Item]:
    out: list[Item] = []
    now = time.time()
    if items:
        (first,) = c.execute(
            "UPDATE sessions SET next_item_seq = next_item_seq + ?, updated_at = ?"
            " WHERE pk = ? RETURNING next_item_seq - ?",
            (len(items), now, pk, len(items)),
        ).fetchone()
        rows = []
        for offset, new in enumerate(items):
            item = Item(
                first + offset,
                turn_id,
                new.kind,
                new.content,
                new.complete,
                new.call_id,
                new.tool_name,
                new.arguments,
                new.meta,
                now,
            )
            out.append(item)
            rows.append(
                (
                    pk,
                    item.seq,
                    turn_id,
                    new.kind,
                    new.content,
                    int(new.complete),
                    new.call_id,
                    new.tool_name,
                    new.arguments,
                    json.dumps(new.meta),
                    now,
                )
            )
        c.executemany(
            "INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,"
            " tool_name, arguments, meta, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
    if events:
        (last,) = c.execute(
            "SELECT COALESCE(MAX(COALESCE(last_seq, seq)), 0) FROM events WHERE turn_id = ?",
            (turn_id,),
        ).fetchone()
        if any(e.seq <= last for e in events):
            raise Conflict(f"an event seq of turn {turn_id} was already written")
        try:
            c.executemany(
                "INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)"
                " VALUES (?,?,?,?,?,?)",
                [(turn_id, *row, now) for row in event_rows(events)],
            )
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"an event seq of turn {turn_id} was already written") from exc
    return out


def finish_turn(
    c: sqlite3.Connection, pk: int, turn: Turn, ending: TurnEnding, write_terminal: bool
) -> Turn:
    now = time.time()
    if ending.status == "rolled_back":
        c.execute("DELETE FROM items WHERE session_pk = ? AND turn_id = ?", (pk, turn.id))
    elif ending.status == "failed":
        c.execute(
            "UPDATE items SET excluded = 1 WHERE session_pk = ? AND turn_id = ?", (pk, turn.id)
        )
    c.execute(
        "UPDATE turns SET status = ?, reason = ?, error = ?, output = ?, complete = ?,"
        " usage = ?, ended_at = ? WHERE id = ?",
        (
            ending.status,
            ending.reason,
            ending.error,
            ending.output,
            int(ending.complete),
            usage_json(ending.usage),
            now,
            turn.id,
        ),
    )
    if write_terminal:
        (last,) = c.execute(
            "SELECT COALESCE(MAX(COALESCE(last_seq, seq)), 0) FROM events WHERE turn_id = ?",
            (turn.id,),
        ).fetchone()
        c.execute(
            "INSERT INTO events (turn_id, seq, type, data, created_at) VALUES (?,?,?,?,?)",
            (
                turn.id,
                last + 1,
                "turn.ended",
                json.dumps(terminal_event_data(turn.id, ending)),
                now,
            ),
        )
    return Turn(
        turn.id,
        turn.key,
        turn.seq,
        turn.input,
        turn.policy,
        ending.status,
        ending.reason,
        ending.error,
        ending.output,
        ending.complete,
        ending.usage,
        turn.created_at,
        turn.started_at,
        now,
    )


def api_key_row(row: tuple[Any, ...]) -> ApiKey:
    return ApiKey(row[0], row[1], row[2], frozenset(json.loads(row[3])), row[4], row[5], row[6])
