"""PostgreSQL's hot functions rewritten as one body commit and answer what the ones they
replace did, case by case: ``tether_enqueue_taken`` (migration 24: an idle session's turn
admitted, leased and started; migration 19's called ``tether_enqueue`` then ``tether_write``),
its own path and every case it hands on to the old one; ``tether_end_release`` (migration 25;
migration 23's called ``tether_end``). Skips without ``TETHER_TEST_POSTGRES_URL`` (see
tests/conformance/postgres_db.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from tether.records import SessionKey
from tether.store import PostgresStore
from tether.store.postgres.functions import END_RELEASING
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
        " t.agent, t.agent_fingerprint, t.idempotency_key, t.request_digest, t.reason,"
        " t.error, t.output, t.complete, t.usage, t.ended_at, t.ran_by, t.held_memory"
        " FROM turns t"
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


async def alike_session(store: PostgresStore, conn: Any, owner: str, now: float) -> None:
    """The owner's session "s", the same row as every other owner's (a new session's token is
    the clock's)."""
    await store.create_session(SessionKey("acme", owner, "s"), "a")
    await conn.execute(
        "UPDATE sessions SET lease_token = 100, created_at = $2 - 10, updated_at = $2 - 10"
        " WHERE owner = $1",
        owner,
        now,
    )


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
            await alike_session(store, conn, owner, now)
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


OLD_END = "old_end_release"
END_PARAMS = [
    "p_tenant", "p_owner", "p_session", "p_token", "p_turn", "p_now",
    "p_kinds", "p_contents", "p_completes", "p_call_ids", "p_tools", "p_arguments", "p_metas",
    "p_event_seqs", "p_event_lasts", "p_event_types", "p_event_datas",
    "p_effect", "p_status", "p_reason", "p_error", "p_output", "p_complete", "p_usage",
    "p_ran_by",
]  # fmt: skip
END_OUTS = (
    "outcome, current_token, first_seq, last_event, turn_seq, turn_input, turn_policy,"
    " turn_created, turn_started, turn_agent, turn_fingerprint, released"
)


def old_end_function() -> str:
    """Migration 23's tether_end_release, under another name."""
    (sql,) = [sql for version, sql in END_RELEASING if version == 23]
    assert "CREATE FUNCTION tether_end_release(" in sql
    return sql.replace("CREATE FUNCTION tether_end_release(", f"CREATE FUNCTION {OLD_END}(")


def end_params(owner: str, now: float, **changed: Any) -> list[Any]:
    values: dict[str, Any] = {
        "p_tenant": "acme",
        "p_owner": owner,
        "p_session": "s",
        "p_token": 101,
        "p_turn": f"run-{owner}",
        "p_now": now,
        "p_kinds": ["assistant"],
        "p_contents": ["the answer"],
        "p_completes": [True],
        "p_call_ids": [None],
        "p_tools": [None],
        "p_arguments": [None],
        "p_metas": ["{}"],
        "p_event_seqs": [3, 4],
        "p_event_lasts": [None, None],
        "p_event_types": ["message.completed", "turn.ended"],
        "p_event_datas": ['{"text": "the answer"}', '{"status": "completed"}'],
        "p_effect": "keep",
        "p_status": "completed",
        "p_reason": "answered",
        "p_error": None,
        "p_output": "the answer",
        "p_complete": True,
        "p_usage": '{"input_tokens": 3}',
        "p_ran_by": "a",
    }
    assert set(changed) <= set(values)
    values |= changed
    return [values[name] for name in END_PARAMS]


async def running(conn: Any, owner: str, now: float) -> None:
    """A turn running under a lease of token 101 (and the session's seqs past it)."""
    marks = ", ".join(f"${n}" for n in range(1, len(PARAMS) + 1))
    outcome = await conn.fetchval(
        f"SELECT outcome FROM tether_enqueue_taken({marks})",
        *params(owner, f"run-{owner}", now - 5),
    )
    assert outcome == "started"


def behind(status: str) -> Setup:
    """Another turn of the session, queued behind the running one, then in ``status``."""

    async def run(conn: Any, owner: str, now: float) -> None:
        marks = ", ".join(f"${n}" for n in range(1, len(PARAMS) + 1))
        outcome = await conn.fetchval(
            f"SELECT outcome FROM tether_enqueue_taken({marks})",
            *params(owner, f"next-{owner}", now - 4),
        )
        assert outcome == "queued"
        await conn.execute("UPDATE turns SET status = $1 WHERE id = $2", status, f"next-{owner}")

    return run


NO_END_ITEMS: dict[str, Any] = {
    name: [] for name in ("p_kinds", "p_contents", "p_completes", "p_call_ids", "p_tools")
} | {"p_arguments": [], "p_metas": []}
NO_END_EVENTS: dict[str, Any] = {
    name: [] for name in ("p_event_seqs", "p_event_lasts", "p_event_types", "p_event_datas")
}
END_CASES: list[tuple[str, Setup, dict[str, Any], tuple[str, bool]]] = [
    ("the session's only turn", nothing, {}, ("ended", True)),
    ("a turn queued behind", behind("queued"), {}, ("ended", False)),
    ("a turn awaiting input behind", behind("awaiting_input"), {}, ("ended", False)),
    ("a turn ended behind", behind("cancelled"), {}, ("ended", True)),
    ("items deleted", nothing, {"p_effect": "delete", "p_status": "rolled_back"}, ("ended", True)),
    ("items excluded", nothing, {"p_effect": "exclude", "p_status": "failed"}, ("ended", True)),
    ("no items", nothing, NO_END_ITEMS, ("ended", True)),
    ("no items, a turn behind", behind("queued"), NO_END_ITEMS, ("ended", False)),
    ("no events", nothing, NO_END_EVENTS, ("ended", True)),
    ("a TTL from its activity", IDLE_TTL, {}, ("ended", True)),
    # Not an ending the store makes, but the function's own promise: a turn left active keeps
    # the lease for itself.
    ("a turn left awaiting input", nothing, {"p_status": "awaiting_input"}, ("ended", False)),
    ("a turn left queued", nothing, {"p_status": "queued"}, ("ended", False)),
    (
        "a turn left running, no items",
        nothing,
        {**NO_END_ITEMS, "p_status": "running"},
        ("ended", False),
    ),
    ("a stale token", nothing, {"p_token": 100}, ("stale", False)),
    ("an unknown session", nothing, {"p_session": "nobody"}, ("missing", False)),
    ("a turn not running", nothing, {"p_turn": "nothing"}, ("status", False)),
    ("events already written", nothing, {"p_event_seqs": [2, 4]}, ("events", False)),
]


@pytest.mark.parametrize(
    ("name", "setup", "changed", "outcome"), END_CASES, ids=[name for name, *_ in END_CASES]
)
async def test_migration_25_commits_what_migration_23_did(
    postgres_url: str,
    name: str,
    setup: Setup,
    changed: dict[str, Any],
    outcome: tuple[str, bool],
) -> None:
    store = PostgresStore(postgres_url)
    await store.open()  # migrated
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute(old_end_function())
        now = time.time()
        for owner in ("new", "old"):
            await alike_session(store, conn, owner, now)
            await running(conn, owner, now)
            await setup(conn, owner, now)
        results = {}
        for owner, fn in (("new", "tether_end_release"), ("old", OLD_END)):
            marks = ", ".join(f"${n}" for n in range(1, len(END_PARAMS) + 1))
            row = await conn.fetchrow(
                f"SELECT {END_OUTS} FROM {fn}({marks})", *end_params(owner, now, **changed)
            )
            ids = {f"run-{owner}": "run", f"next-{owner}": "next"}
            results[owner] = (dict(row), await state(conn, owner, ids))
        assert (results["new"][0]["outcome"], results["new"][0]["released"]) == outcome
        assert results["new"] == results["old"], name
    finally:
        await conn.close()
        await store.close()


async def test_a_session_made_while_the_admission_waits_is_not_found_by_either(
    postgres_url: str,
) -> None:
    """A session deleted and made again under the same key by a transaction the admission
    waits on: migration 19's looked once, before the wait's end, and answered 'missing';
    migration 24's answers the same (a second look, with a newer snapshot, would find the
    new session and start a turn on it)."""
    store = PostgresStore(postgres_url)
    await store.open()
    caller, other = await asyncpg.connect(postgres_url), await asyncpg.connect(postgres_url)
    try:
        await caller.execute(old_function())
        marks = ", ".join(f"${n}" for n in range(1, len(PARAMS) + 1))
        for owner, fn in (("new", "tether_enqueue_taken"), ("old", OLD)):
            await store.create_session(SessionKey("acme", owner, "s"), "a")
            now = time.time()
            remaking = other.transaction()
            await remaking.start()
            await other.execute("DELETE FROM sessions WHERE owner = $1", owner)
            await other.execute(
                "INSERT INTO sessions (tenant, owner, session_id, agent, created_at,"
                " updated_at) VALUES ('acme', $1, 's', 'a', $2, $2)",
                owner,
                now,
            )
            call = asyncio.ensure_future(
                caller.fetchval(
                    f"SELECT outcome FROM {fn}({marks})", *params(owner, f"t-{owner}", now)
                )
            )
            await asyncio.sleep(0.3)
            assert not call.done()  # waiting on the row lock of the deleted session
            await remaking.commit()
            assert await call == "missing", fn
            turns = await caller.fetchval(
                "SELECT count(*) FROM turns t JOIN sessions s ON s.pk = t.session_pk"
                " WHERE s.owner = $1",
                owner,
            )
            assert turns == 0
    finally:
        await caller.close()
        await other.close()
        await store.close()
