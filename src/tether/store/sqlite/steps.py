"""The row-level steps the SQLite store's transactions share.

Every function takes the connection of the store's writer thread and runs inside the
transaction its caller is in; none of them commits. What a step decides is
:mod:`tether.store.rules`; this module only reads the facts for it and writes the outcome.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

from tether.errors import Conflict, SessionNotFound, StaleLease
from tether.records import (
    CancelStatus,
    Decision,
    Item,
    Lease,
    NewEvent,
    NewItem,
    Reason,
    SessionKey,
    Turn,
    TurnEnding,
)
from tether.store import rules
from tether.store.rows import decision_row, event_rows, key_args, turn_row, usage_json
from tether.store.sqlite import queries as q
from tether.store.sqlite.recall_steps import apply_writes


def session_pk(c: sqlite3.Connection, key: SessionKey) -> int:
    row = c.execute(q.SESSION_PK, key_args(key)).fetchone()
    if row is None:
        raise SessionNotFound("session not found")
    return int(row[0])


def fenced_pk(c: sqlite3.Connection, lease: Lease) -> int:
    return fenced_session(c, lease)[0]


def fenced_session(c: sqlite3.Connection, lease: Lease) -> tuple[int, float | None]:
    """The session's pk and expiry, once the lease is found current."""
    # Runs inside BEGIN IMMEDIATE: nobody can move the token between this read and the
    # writes that follow in the same transaction.
    row = c.execute(q.FENCE, key_args(lease.key)).fetchone()
    if row is None:
        raise SessionNotFound("session not found")
    if row[1] != lease.token:
        raise StaleLease(rules.stale_message(lease.token, row[1]))
    return int(row[0]), row[2]


def first_active(c: sqlite3.Connection, pk: int) -> str | None:
    row = c.execute(q.FIRST_ACTIVE_TURN, (pk,)).fetchone()
    return str(row[0]) if row is not None else None


def get_turn(c: sqlite3.Connection, pk: int, turn_id: str) -> Turn | None:
    row = c.execute(q.GET_TURN, (turn_id, pk)).fetchone()
    return turn_row(row) if row else None


def last_event_seq(c: sqlite3.Connection, turn_id: str) -> int:
    (last,) = c.execute(q.LAST_EVENT_SEQ, (turn_id,)).fetchone()
    return int(last)


def write_event(c: sqlite3.Connection, turn_id: str, event: NewEvent, now: float) -> None:
    """One event whose seq the caller knows to be new (a turn's first, or its terminal one),
    stamped with the time of the change it announces."""
    c.execute(q.INSERT_EVENT, (turn_id, event.seq, None, event.type, json.dumps(event.data), now))


def item_values(pk: int, item: Item, now: float) -> tuple[Any, ...]:
    """An item's row, as ``q.INSERT_ITEM`` takes it."""
    return (
        pk,
        item.seq,
        item.turn_id,
        item.kind,
        item.content,
        int(item.complete),
        item.call_id,
        item.tool_name,
        item.arguments,
        json.dumps(item.meta),
        now,
    )


def add_rows(
    c: sqlite3.Connection,
    pk: int,
    turn_id: str,
    items: Sequence[NewItem],
    events: Sequence[NewEvent],
    *,
    last_event: int | None = None,
) -> list[Item]:
    """Write a turn's items (the store assigns their seqs) and events; ``last_event`` is the
    turn's last event seq when the caller knows it (a turn admitted in the same transaction),
    read otherwise."""
    now = time.time()
    out: list[Item] = []
    if events:
        if last_event is None:
            last_event = last_event_seq(c, turn_id)
        # Checked before the first write, so a refused call changes nothing even on its own.
        rules.check_event_seqs(turn_id, last_event, [e.seq for e in events])
    if items:
        (first,) = c.execute(q.NEXT_ITEM_SEQS, (len(items), now, pk, len(items))).fetchone()
        out = rules.stored_items(turn_id, first, items, now)
        c.executemany(q.INSERT_ITEM, [item_values(pk, i, now) for i in out])
    if events:
        insert_events(c, turn_id, events, now)
    return out


def insert_events(
    c: sqlite3.Connection, turn_id: str, events: Sequence[NewEvent], now: float
) -> None:
    """A turn's new events, whose seqs the caller checked."""
    try:
        c.executemany(q.INSERT_EVENT, [(turn_id, *row, now) for row in event_rows(events)])
    except sqlite3.IntegrityError as exc:
        raise Conflict(f"an event seq of turn {turn_id} was already written") from exc


def finish(
    c: sqlite3.Connection, pk: int, turn: Turn, ending: TurnEnding, *, terminal: bool
) -> Turn:
    """Give the turn its ending; with ``terminal``, also its ``turn.ended`` event (endings the
    store makes itself: a queued turn cancelled, a dead owner's turn recovered)."""
    now = time.time()
    effect = rules.items_effect(ending.status)
    if effect == "delete":
        c.execute(q.DELETE_TURN_ITEMS, (pk, turn.id))
    elif effect == "exclude":
        c.execute(q.EXCLUDE_TURN_ITEMS, (pk, turn.id))
    c.execute(
        q.FINISH_TURN,
        (
            ending.status,
            ending.reason,
            ending.error,
            ending.output,
            int(ending.complete),
            usage_json(ending.usage),
            now,
            ending.agent,
            turn.id,
        ),
    )
    if terminal:
        event = rules.terminal_event(turn.id, ending, last_event_seq(c, turn.id))
        write_event(c, turn.id, event, now)
    return rules.ended(turn, ending, now)


def recover(c: sqlite3.Connection, pk: int) -> list[Turn]:
    """End the session's running turns as failed/``owner_lost``, answering orphaned calls."""
    out = []
    for turn in map(turn_row, c.execute(q.RUNNING_TURNS, (pk,)).fetchall()):
        orphans = c.execute(q.ORPHAN_CALLS, (pk, turn.id)).fetchall()
        add_rows(c, pk, turn.id, rules.aborted_results((o[0], o[1]) for o in orphans), [])
        out.append(finish(c, pk, turn, rules.owner_lost(turn), terminal=True))
    return out


def close_decision(c: sqlite3.Connection, done: Decision, now: float, *, requeue: bool) -> None:
    """Write a decision's end and its ``decision.made`` event; with ``requeue``, the parked turn
    goes back to the queue for the session's next owner. The caller has read it pending in this
    transaction (the write lock is held, so it still is)."""
    c.execute(
        q.CLOSE_DECISION,
        (done.status, done.answer, done.decided_by, done.decided_at, done.turn_id, done.call_id),
    )
    event = rules.decision_made_event(done, last_event_seq(c, done.turn_id))
    write_event(c, done.turn_id, event, now)
    if requeue:
        c.execute(q.REQUEUE_TURN, (done.turn_id,))


def end_waiting(
    c: sqlite3.Connection,
    pk: int,
    key: SessionKey,
    turn_id: str,
    status: CancelStatus,
    reason: Reason,
) -> Turn | None:
    """End a turn nobody runs (queued, or parked on a decision); None when it is not such a
    turn. Its pending decisions expire, its calls are all paired, its held memory is applied
    when the ending keeps its items."""
    row = c.execute(q.WAITING_TURN, (turn_id, pk)).fetchone()
    if row is None:
        return None
    now = time.time()
    ending = rules.waiting_ending(status, reason, turn_row(row))
    for pending in c.execute(q.PENDING_OF_TURN, (turn_id,)).fetchall():
        done = rules.dropped(decision_row(key, pending), now)
        close_decision(c, done, now, requeue=False)
    orphans = c.execute(q.ORPHAN_CALLS, (pk, turn_id)).fetchall()
    add_rows(c, pk, turn_id, rules.aborted_results((o[0], o[1]) for o in orphans), [])
    done_turn = finish(c, pk, turn_row(row), ending, terminal=True)
    c.execute(q.SKIP_ITEM_SEQS, (rules.ITEM_SEQ_GAP, pk))
    held = rules.held_memory(row[-1])
    if held and rules.keeps_memory(ending.status):
        apply_writes(c, held)
    return done_turn
