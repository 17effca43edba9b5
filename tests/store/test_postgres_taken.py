"""PostgreSQL's ``tether_enqueue_taken`` (migration 24: an idle session's turn admitted, leased
and started in one body) commits and answers what migration 19's did (``tether_enqueue`` then
``tether_write``), case by case: its own path, and every case it hands on to the old one.
Skips without ``TETHER_TEST_POSTGRES_URL`` (see tests/conformance/postgres_db.py)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from tether.records import SessionKey
from tether.store import PostgresStore
from tether.store.postgres.session_functions import SESSION_FUNCTIONS

OLD = "old_enqueue_taken"
PARAMS = [
    "p_tenant",
    "p_owner",
    "p_session",
    "p_turn",
    "p_input",
    "p_policy",
    "p_now",
    "p_agent",
    "p_fingerprint",
    "p_idem",
    "p_digest",
    "p_max_queue",
    "p_limits",
    "p_running",
    "p_queued",
    "p_event_seq",
    "p_event_type",
    "p_by",
    "p_lease_until",
    "p_kinds",
    "p_contents",
    "p_completes",
    "p_call_ids",
    "p_tools",
    "p_arguments",
    "p_metas",
    "p_event_seqs",
    "p_event_lasts",
    "p_event_types",
    "p_event_datas",
    "p_expect_agent",
]
OUTS = (
    "outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total, r_token,"
    " r_next_item, first_seq, found_agent"
)


def old_function() -> str:
    """Migration 19's tether_enqueue_taken, under another name."""
    (sql,) = [sql for version, sql in SESSION_FUNCTIONS if version == 19]
    assert "CREATE FUNCTION tether_enqueue_taken(" in sql
    return sql.replace("CREATE FUNCTION tether_enqueue_taken(", f"CREATE FUNCTION {OLD}(")


def params(owner: str, turn: str, now: float, **changed: Any) -> list[Any]:
    values: dict[str, Any] = {
        "p_tenant": "acme",
        "p_owner": owner,
        "p_session": "s",
        "p_turn": turn,
        "p_input": "hello",
        "p_policy": "enqueue",
        "p_now": now,
        "p_agent": "a",
        "p_fingerprint": "fp",
        "p_idem": None,
        "p_digest": None,
        "p_max_queue": 16,
        "p_limits": True,
        "p_running": 8,
        "p_queued": 16,
        "p_event_seq": 1,
        "p_event_type": "turn.queued",
        "p_by": "me",
        "p_lease_until": now + 30,
        "p_kinds": ["user"],
        "p_contents": ["hello"],
        "p_completes": [True],
        "p_call_ids": [None],
        "p_tools": [None],
        "p_arguments": [None],
        "p_metas": ["{}"],
        "p_event_seqs": [2],
        "p_event_lasts": [None],
        "p_event_types": ["turn.started"],
        "p_event_datas": ['{"turn_id": "t"}'],
        "p_expect_agent": None,
    }
    assert set(changed) <= set(values)
    values |= changed
    return [values[name] for name in PARAMS]


async def state(conn: Any, owner: str, ids: dict[str, str]) -> dict[str, Any]:
    """What is committed of the owner's session, its turns' ids read through ``ids``."""

    def named(turn_id: str) -> str:
        return ids.get(turn_id, turn_id)

    session = await conn.fetchrow(
        "SELECT next_turn_seq, next_item_seq, lease_owner, lease_token, lease_expires_at,"
        " updated_at, expires_at, idle_ttl, revision FROM sessions"
        " WHERE tenant = 'acme' AND owner = $1",
        owner,
    )
    turns = await conn.fetch(
        "SELECT t.id, t.seq, t.input, t.policy, t.status, t.created_at, t.started_at,"
        " t.agent, t.agent_fingerprint, t.idempotency_key, t.request_digest FROM turns t"
        " JOIN sessions s ON s.pk = t.session_pk WHERE s.owner = $1 ORDER BY t.seq",
        owner,
    )
    events = await conn.fetch(
        "SELECT e.turn_id, e.seq, e.last_seq, e.type, e.data, e.created_at FROM events e"
        " JOIN turns t ON t.id = e.turn_id JOIN sessions s ON s.pk = t.session_pk"
        " WHERE s.owner = $1 ORDER BY e.turn_id, e.seq",
        owner,
    )
    items = await conn.fetch(
        "SELECT i.seq, i.turn_id, i.kind, i.content, i.complete, i.call_id, i.meta,"
        " i.excluded, i.created_at FROM items i JOIN sessions s ON s.pk = i.session_pk"
        " WHERE s.owner = $1 ORDER BY i.seq",
        owner,
    )
    busy = await conn.fetchval("SELECT live FROM busy_sessions WHERE owner = $1", owner)
    return {
        "session": dict(session) if session else None,
        "turns": [{**dict(t), "id": named(t["id"])} for t in turns],
        "events": [{**dict(e), "turn_id": named(e["turn_id"])} for e in events],
        "items": [{**dict(i), "turn_id": named(i["turn_id"])} for i in items],
        "busy": busy,
    }


Setup = Callable[[Any, str, float], Awaitable[None]]


async def nothing(conn: Any, owner: str, now: float) -> None:
    return None


def sql(statement: str) -> Setup:
    async def run(conn: Any, owner: str, now: float) -> None:
        await conn.execute(statement, owner, now)

    return run


def earlier_turn(status: str) -> Setup:
    async def run(conn: Any, owner: str, now: float) -> None:
        pk = await conn.fetchval("SELECT pk FROM sessions WHERE owner = $1", owner)
        await conn.execute(
            "UPDATE sessions SET next_turn_seq = 2, next_item_seq = 3 WHERE pk = $1", pk
        )
        await conn.execute(
            "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at)"
            " VALUES ($1, $2, 1, 'before', 'enqueue', $3, $4)",
            f"before-{owner}",
            pk,
            status,
            now - 5,
        )

    return run


HELD = sql(
    "UPDATE sessions SET lease_owner = 'other', lease_token = 7, lease_expires_at = $2 + 60"
    " WHERE owner = $1"
)
EXPIRED_LEASE = sql(
    "UPDATE sessions SET lease_owner = 'other', lease_token = 7, lease_expires_at = $2 - 1"
    " WHERE owner = $1"
)
EXPIRED = sql("UPDATE sessions SET expires_at = $2 - 1 WHERE owner = $1")
IDLE_TTL = sql("UPDATE sessions SET idle_ttl = 600, expires_at = $2 + 100 WHERE owner = $1")
NO_ITEMS: dict[str, Any] = {
    name: [] for name in ("p_kinds", "p_contents", "p_completes", "p_call_ids", "p_tools")
} | {"p_arguments": [], "p_metas": []}

CASES: list[tuple[str, Setup, dict[str, Any], str]] = [
    ("an idle session", nothing, {}, "started"),
    ("after a completed turn", earlier_turn("completed"), {}, "started"),
    ("a session whose TTL counts from its activity", IDLE_TTL, {}, "started"),
    ("a lease another process let expire", EXPIRED_LEASE, {}, "started"),
    (
        "two items and no events",
        nothing,
        {
            "p_kinds": ["user", "user"],
            "p_contents": ["a", "b"],
            "p_completes": [True, False],
            "p_call_ids": [None, None],
            "p_tools": [None, None],
            "p_arguments": [None, None],
            "p_metas": ["{}", '{"m": 1}'],
            "p_event_seqs": [],
            "p_event_lasts": [],
            "p_event_types": [],
            "p_event_datas": [],
        },
        "started",
    ),
    ("the owner's bound", nothing, {"p_running": 0}, "refused"),
    ("no bound asked", nothing, {"p_limits": False}, "started"),
    ("the expected agent", nothing, {"p_expect_agent": "a"}, "started"),
    # Handed on to migration 19's way:
    ("an idempotency key", nothing, {"p_idem": "k", "p_digest": "d"}, "started"),
    ("a lease another process holds", HELD, {}, "queued"),
    ("a turn ahead", earlier_turn("queued"), {}, "queued"),
    ("a turn awaiting input ahead", earlier_turn("awaiting_input"), {}, "queued"),
    ("events that do not follow the queued one", nothing, {"p_event_seqs": [1]}, "queued"),
    ("an expired session", EXPIRED, {}, "refused"),
    ("no room in the queue", nothing, {"p_max_queue": 0}, "refused"),
    ("nothing to lease for", nothing, {"p_lease_until": None}, "queued"),
    ("no items", nothing, NO_ITEMS, "started"),
    ("another agent expected", nothing, {"p_expect_agent": "b"}, "agent"),
    ("an unknown session", nothing, {"p_session": "nobody"}, "missing"),
]


@pytest.mark.parametrize(
    ("name", "setup", "changed", "outcome"), CASES, ids=[name for name, *_ in CASES]
)
async def test_migration_24_commits_what_migration_19_did(
    postgres_url: str, name: str, setup: Setup, changed: dict[str, Any], outcome: str
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()  # migrated
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(old_function())
        now = time.time()
        for owner in ("new", "old"):
            await store.create_session(SessionKey("acme", owner, "s"), "a")
            # The same row but for the owner (a new session's token is random).
            await conn.execute(
                "UPDATE sessions SET lease_token = 100, created_at = $2 - 10,"
                " updated_at = $2 - 10 WHERE owner = $1",
                owner,
                now,
            )
            await setup(conn, owner, now)
        results = {}
        for owner, fn in (("new", "tether_enqueue_taken"), ("old", OLD)):
            marks = ", ".join(f"${n}" for n in range(1, len(PARAMS) + 1))
            row = await conn.fetchrow(
                f"SELECT {OUTS} FROM {fn}({marks})",
                *params(owner, f"turn-{owner}", now, **changed),
            )
            ids = {f"turn-{owner}": "turn", f"before-{owner}": "before"}
            answer = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in dict(row).items()}
            answer["active_ids"] = [ids.get(i, i) for i in answer["active_ids"] or []]
            results[owner] = (answer, await state(conn, owner, ids))
        assert results["new"][0]["outcome"] == outcome
        assert results["new"] == results["old"], name
    finally:
        await conn.close()
        await store.close()


async def test_an_idle_sessions_turn_updates_its_row_once(postgres_url: str) -> None:
    """What migration 24 is for: the admission, the lease and the start are one update of the
    session's row, and the turn is written once (migration 19's: three updates or more, and
    two)."""
    store = PostgresStore(postgres_url)
    await store.open()
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(old_function())
        now = time.time()
        updates = {}
        for owner, fn in (("new", "tether_enqueue_taken"), ("old", OLD)):
            await store.create_session(SessionKey("acme", owner, "s"), "a")
            marks = ", ".join(f"${n}" for n in range(1, len(PARAMS) + 1))
            async with conn.transaction():
                outcome = await conn.fetchval(
                    f"SELECT outcome FROM {fn}({marks})", *params(owner, f"t-{owner}", now)
                )
                updates[owner] = await conn.fetchrow(
                    "SELECT pg_stat_get_xact_tuples_updated('sessions'::regclass) AS sessions,"
                    " pg_stat_get_xact_tuples_updated('turns'::regclass) AS turns"
                )
            assert outcome == "started"
        assert dict(updates["new"]) == {"sessions": 1, "turns": 0}
        assert updates["old"]["sessions"] >= 3 and updates["old"]["turns"] == 1
    finally:
        await conn.close()
        await store.close()
