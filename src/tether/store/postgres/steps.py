"""The PostgreSQL store's transactional steps: fencing, and a turn's writes.

Each function runs inside a transaction its caller opened (READ COMMITTED) on one connection,
and every write here is preceded, in that transaction, by the session's row lock. What a step
decides is :mod:`tether.store.rules`; this module reads the facts for it and writes the outcome.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import asyncpg  # type: ignore[import-untyped]

from tether.errors import Conflict, SessionNotFound, StaleLease
from tether.records import Decision, Item, Lease, NewEvent, NewItem, SessionKey, Turn, TurnEnding
from tether.store import rules
from tether.store.postgres import queries as q

# The folding of text deltas and the JSON of usage are the SQLite store's: one record format.
from tether.store.rows import event_rows, key_args, turn_row, usage_json

Row = tuple[Any, ...]
"""An ``asyncpg.Record``: read here only as a tuple is (by position, unpacked)."""


class Conn(Protocol):
    """The part of ``asyncpg.Connection`` the store uses (asyncpg ships no type information)."""

    async def execute(self, query: str, *args: Any) -> str: ...
    async def fetch(self, query: str, *args: Any) -> list[Row]: ...
    async def fetchrow(self, query: str, *args: Any) -> Row | None: ...
    async def fetchval(self, query: str, *args: Any) -> Any: ...
    def transaction(self, *, isolation: str) -> AbstractAsyncContextManager[Any]: ...


def count(tag: str) -> int:
    """The row count of a command tag such as ``DELETE 3``."""
    return int(tag.rsplit(" ", 1)[-1]) if tag else 0


async def lock_session(conn: Conn, key: SessionKey) -> Row:
    """``(pk, lease_token, expires_at)`` of the session, its row locked until the commit."""
    row = await conn.fetchrow(q.LOCK_SESSION, *key_args(key))
    if row is None:
        raise SessionNotFound("session not found")
    return row


async def fenced_pk(conn: Conn, lease: Lease) -> int:
    # The row lock is held to the end of the caller's transaction: nobody can move the token
    # between this check and the writes that follow it.
    pk, token, _ = await lock_session(conn, lease.key)
    if token != lease.token:
        raise StaleLease(rules.stale_message(lease.token, token))
    return int(pk)


async def add(
    conn: Conn, pk: int, turn_id: str, items: Sequence[NewItem], events: Sequence[NewEvent]
) -> list[Item]:
    """Write items (the store assigns their seqs) and events of a turn."""
    now = time.time()
    out: list[Item] = []
    if events:
        # Checked before the first write: a refused call changes nothing.
        last = await conn.fetchval(q.LAST_EVENT_SEQ, turn_id)
        rules.check_event_seqs(turn_id, int(last), [e.seq for e in events])
    if items:
        first = int(await conn.fetchval(q.NEXT_ITEM_SEQS, pk, len(items), now))
        out = rules.stored_items(turn_id, first, items, now)
        await conn.execute(
            q.INSERT_ITEMS,
            pk,
            turn_id,
            now,
            [i.seq for i in out],
            [i.kind for i in out],
            [i.content for i in out],
            [i.complete for i in out],
            [i.call_id for i in out],
            [i.tool_name for i in out],
            [i.arguments for i in out],
            [json.dumps(i.meta) for i in out],
        )
    if events:
        # One array per column (seq, last_seq, type, data): a single INSERT for all the rows.
        columns = [list(c) for c in zip(*event_rows(events), strict=True)]
        try:
            await conn.execute(q.INSERT_EVENTS, turn_id, now, *columns)
        except asyncpg.UniqueViolationError as exc:
            raise Conflict(f"an event seq of turn {turn_id} was already written") from exc
    return out


async def write_event(conn: Conn, turn_id: str, event: NewEvent, now: float) -> None:
    """One event whose seq the caller knows to be new (a turn's first, or its terminal one),
    stamped with the time of the change it announces."""
    data = json.dumps(event.data)
    await conn.execute(q.INSERT_EVENT, turn_id, event.seq, event.type, data, now)


async def finish(conn: Conn, pk: int, turn: Turn, ending: TurnEnding, *, terminal: bool) -> Turn:
    """Give the turn its ending; with ``terminal``, also its ``turn.ended`` event (endings the
    store makes itself: a queued turn cancelled, a dead owner's turn recovered)."""
    now = time.time()
    effect = rules.items_effect(ending.status)
    if effect == "delete":
        await conn.execute(q.DELETE_TURN_ITEMS, pk, turn.id)
    elif effect == "exclude":
        await conn.execute(q.EXCLUDE_TURN_ITEMS, pk, turn.id)
    await conn.execute(
        q.FINISH_TURN,
        turn.id,
        ending.status,
        ending.reason,
        ending.error,
        ending.output,
        ending.complete,
        usage_json(ending.usage),
        now,
        ending.agent,
    )
    if terminal:
        last = int(await conn.fetchval(q.LAST_EVENT_SEQ, turn.id))
        await write_event(conn, turn.id, rules.terminal_event(turn.id, ending, last), now)
    return rules.ended(turn, ending, now)


async def recover(conn: Conn, pk: int) -> list[Turn]:
    """End the session's running turns as failed/``owner_lost``, answering orphaned calls."""
    out = []
    for turn in map(turn_row, await conn.fetch(q.RUNNING_TURNS, pk)):
        orphans = await conn.fetch(q.ORPHAN_CALLS, pk, turn.id)
        aborted = rules.aborted_results((call_id, tool) for call_id, tool in orphans)
        await add(conn, pk, turn.id, aborted, [])
        out.append(await finish(conn, pk, turn, rules.owner_lost(turn), terminal=True))
    return out


async def close_decision(conn: Conn, done: Decision, now: float, *, requeue: bool) -> bool:
    """End a pending decision as ``done`` with its ``decision.made`` event; with ``requeue``,
    the parked turn goes back to the queue for the session's next owner. The caller holds the
    session's row lock, as every writer of its decisions does. False (nothing written) when the
    decision was no longer pending."""
    args = (done.status, done.answer, done.decided_by, done.decided_at)
    if await conn.fetchval(q.CLOSE_DECISION, done.turn_id, done.call_id, *args) is None:
        return False
    await decision_made(conn, done, now)
    if requeue:
        await conn.execute(q.REQUEUE_TURN, done.turn_id)
        await notify_holder(conn, done.key, now)
    return True


async def notify_holder(
    conn: Conn, key: SessionKey, now: float, *, unless: str | None = None
) -> None:
    """Tell the process holding ``key``'s lease, if any and if not ``unless`` (a lease owner
    that wakes its own worker), to look at its queue; delivered on commit."""
    await conn.execute(q.NOTIFY_HOLDER, q.QUEUED_CHANNEL, *key_args(key), now, unless)


async def decision_made(conn: Conn, done: Decision, now: float) -> None:
    last = int(await conn.fetchval(q.LAST_EVENT_SEQ, done.turn_id))
    await write_event(conn, done.turn_id, rules.decision_made_event(done, last), now)
