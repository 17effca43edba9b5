"""The SQLite store's shorter ways write and answer what the longer ones did, case by case: a
turn on an idle session admitted, leased and started in one pass (``turns._start_at_once``),
every case it leaves to the admission, the lease and the start answered as before; and a
turn's ending that gives the lease up (``turns._end_released``) against the ending, then the
look for another turn, then the release."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from tether.records import (
    AgentRef,
    Lease,
    NewEvent,
    NewItem,
    PrincipalLimits,
    SessionKey,
    TurnEnding,
)
from tether.store import SQLiteStore
from tether.store.rows import key_args
from tether.store.sqlite import queries as q
from tether.store.sqlite import turns

NOW = 1_800_000_000.0
Setup = Callable[[SQLiteStore, sqlite3.Connection, SessionKey], Any]


async def nothing(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
    return None


async def a_turn(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
    """A turn run to its end, the lease given up."""
    turn, lease, _ = await store.enqueue_turn_taken(
        key, owner="me", ttl=30, turn_id=f"before-{key.owner}", input="before",
        policy="enqueue", items=[NewItem("user", "before")],
        events=[NewEvent(2, "turn.started", {})],
    )  # fmt: skip
    assert lease is not None
    await store.end_turn_released(
        lease, turn.id, TurnEnding("completed", "answered", output="ok", complete=True),
        [NewItem("assistant", "ok")], [NewEvent(3, "turn.ended", {})],
    )  # fmt: skip


async def queued_ahead(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
    await store.enqueue_turn(key, turn_id=f"before-{key.owner}", input="ahead", policy="enqueue")


def sql(statement: str) -> Setup:
    async def run(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
        with db:
            db.execute(statement, (key.owner,))

    return run


HELD = sql(
    f"UPDATE sessions SET lease_owner = 'other', lease_expires_at = {NOW + 60} WHERE owner = ?"
)
LAPSED = sql(
    f"UPDATE sessions SET lease_owner = 'other', lease_expires_at = {NOW - 1} WHERE owner = ?"
)
EXPIRED = sql(f"UPDATE sessions SET expires_at = {NOW - 1} WHERE owner = ?")
IDLE_TTL = sql(f"UPDATE sessions SET idle_ttl = 600, expires_at = {NOW + 100} WHERE owner = ?")

ONE_PASS, REFUSED, HANDED_ON = "one pass", "refused", "handed on"
CASES: list[tuple[str, Setup, dict[str, Any], str]] = [
    ("an idle session", nothing, {}, ONE_PASS),
    ("after a turn", a_turn, {}, ONE_PASS),
    ("a TTL from its activity", IDLE_TTL, {}, ONE_PASS),
    ("a lease another process let lapse", LAPSED, {}, ONE_PASS),
    ("two items, no events", nothing, {
        "items": [NewItem("user", "a"), NewItem("user", "b", meta={"m": 1})], "events": [],
    }, ONE_PASS),
    ("an agent", nothing, {"agent": AgentRef("a", "fp")}, ONE_PASS),
    ("the expected agent", nothing, {"expect_agent": "assistant"}, ONE_PASS),
    ("bounds with room", nothing, {"limits": PrincipalLimits(running_turns=4)}, ONE_PASS),
    # Refused, as the three steps refuse, before anything is written:
    ("the owner's bound", nothing, {"limits": PrincipalLimits(running_turns=0)}, REFUSED),
    ("another agent expected", nothing, {"expect_agent": "other"}, REFUSED),
    ("an expired session", EXPIRED, {}, REFUSED),
    ("no room in the queue", nothing, {"max_queue": 0}, REFUSED),
    ("events not past the queued one", nothing, {
        "events": [NewEvent(1, "turn.started", {})],
    }, REFUSED),
    ("a turn id taken", a_turn, {"turn_id": "before"}, REFUSED),
    ("a turn id taken, events not past", a_turn, {
        "turn_id": "before", "events": [NewEvent(1, "turn.started", {})],
    }, REFUSED),
    # Left to the admission, the lease and the start:
    ("a lease another process holds", HELD, {}, HANDED_ON),
    ("a turn ahead", queued_ahead, {}, HANDED_ON),
    ("no items", nothing, {"items": []}, HANDED_ON),
    ("an unknown session", nothing, {"session": "nobody"}, HANDED_ON),
]  # fmt: skip


def dump(db: sqlite3.Connection, owner: str) -> dict[str, Any]:
    def rows(statement: str) -> list[dict[str, Any]]:
        cur = db.execute(statement, (owner,))
        names = [d[0] for d in cur.description]
        out = []
        for row in cur.fetchall():
            record = {
                k: v for k, v in zip(names, row, strict=True) if k not in ("pk", "session_pk")
            }
            for k, v in record.items():
                if isinstance(v, str):
                    record[k] = v.replace(owner, "OWNER")
            out.append(record)
        return out

    return {
        "sessions": rows(
            "SELECT next_turn_seq, next_item_seq, lease_owner, lease_token, lease_expires_at,"
            " updated_at, expires_at, idle_ttl, revision FROM sessions WHERE owner = ?"
        ),
        "turns": rows("SELECT t.* FROM turns t WHERE t.owner = ? ORDER BY t.seq"),
        "events": rows(
            "SELECT e.* FROM events e JOIN turns t ON t.id = e.turn_id WHERE t.owner = ?"
            " ORDER BY e.turn_id, e.seq"
        ),
        "items": rows(
            "SELECT i.* FROM items i JOIN sessions s ON s.pk = i.session_pk WHERE s.owner = ?"
            " ORDER BY i.seq"
        ),
    }


async def outcome(store: SQLiteStore, key: SessionKey, changed: dict[str, Any]) -> Any:
    args: dict[str, Any] = {
        "owner": "me",
        "ttl": 30.0,
        "turn_id": f"t-{key.owner}",
        "input": "hello",
        "policy": "enqueue",
        "items": [NewItem("user", "hello")],
        "events": [NewEvent(2, "turn.started", {"turn_id": "t"})],
    } | {k: v for k, v in changed.items() if k != "session"}
    if args["turn_id"] == "before":
        args["turn_id"] = f"before-{key.owner}"
    if "session" in changed:
        key = SessionKey(key.tenant, key.owner, changed["session"])
    try:
        turn, lease, written = await store.enqueue_turn_taken(key, **args)
    except Exception as exc:
        return type(exc).__name__, str(exc).replace(key.owner, "OWNER")
    answer = {
        "turn": {k: v for k, v in asdict(turn).items() if k not in ("key", "id")},
        "lease": {k: v for k, v in asdict(lease).items() if k != "key"} if lease else None,
        "written": [asdict(i) for i in written] if written is not None else None,
    }
    return repr(answer).replace(key.owner, "OWNER")


@pytest.mark.parametrize(("name", "setup", "changed", "way"), CASES, ids=[c[0] for c in CASES])
async def test_one_pass_writes_and_answers_what_three_steps_did(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    setup: Setup,
    changed: dict[str, Any],
    way: str,
) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)
    store = SQLiteStore(tmp_path / "t.db")
    await store.open()
    db = sqlite3.connect(tmp_path / "t.db")
    passes: list[str] = []
    one_pass = turns._start_at_once

    def counted(*args: Any) -> Any:
        result = one_pass(*args)
        passes.append(ONE_PASS if result is not None else HANDED_ON)
        return result

    try:
        answers = {}
        for owner in ("alpha-owner", "beta-owner"):
            key = SessionKey("acme", owner, "s")
            await store.create_session(key, "assistant")
            with db:  # a new session's first token is the clock's: the same for both
                db.execute("UPDATE sessions SET lease_token = 100 WHERE owner = ?", (owner,))
            monkeypatch.setattr(turns, "_start_at_once", one_pass)
            await setup(store, db, key)
            # beta: the admission, the lease and the start, one after the other.
            monkeypatch.setattr(
                turns, "_start_at_once", counted if owner == "alpha-owner" else lambda *a: None
            )
            answers[owner] = (await outcome(store, key, changed), dump(db, owner))
        assert answers["alpha-owner"] == answers["beta-owner"], name
        answer = answers["alpha-owner"][0]
        if way == REFUSED:
            assert isinstance(answer, tuple) and passes == [], answer
        elif way == ONE_PASS:
            assert passes == [ONE_PASS], answer
        else:
            assert passes in ([HANDED_ON], []), answer
    finally:
        db.close()
        await store.close()


def three_steps(c: sqlite3.Connection, lease: Lease, turn_id: str, *rest: Any) -> Any:
    """The ending that gives the lease up as it was: ``_end``, the look, the release."""
    pk, done = turns._end(c, lease, turn_id, *rest)
    if c.execute(q.FIRST_ACTIVE_TURN, (pk,)).fetchone() is not None:
        return done, False
    c.execute(q.RELEASE_LEASE, (*key_args(lease.key), lease.token))
    return done, True


async def turn_behind(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
    await store.enqueue_turn(key, turn_id=f"next-{key.owner}", input="next", policy="enqueue")


def behind_as(status: str) -> Setup:
    async def run(store: SQLiteStore, db: sqlite3.Connection, key: SessionKey) -> None:
        await turn_behind(store, db, key)
        with db:
            db.execute("UPDATE turns SET status = ? WHERE id = ?", (status, f"next-{key.owner}"))

    return run


ANSWER = [NewItem("assistant", "the answer")]
ENDED = [NewEvent(3, "message.completed", {"text": "x"}), NewEvent(4, "turn.ended", {})]
END_CASES: list[tuple[str, Setup, dict[str, Any]]] = [
    ("the session's only turn", nothing, {}),
    ("a turn queued behind", turn_behind, {}),
    ("a turn awaiting input behind", behind_as("awaiting_input"), {}),
    ("a turn ended behind", behind_as("cancelled"), {}),
    ("items deleted", nothing, {"ending": TurnEnding("rolled_back", "cancelled")}),
    ("items excluded", nothing, {"ending": TurnEnding("failed", "model_error", error="boom")}),
    ("no items", nothing, {"items": []}),
    ("no items, a turn behind", turn_behind, {"items": []}),
    ("no events", nothing, {"events": []}),
    ("a TTL from its activity", IDLE_TTL, {}),
    ("a stale lease", nothing, {"token": 1}),
    ("an unknown session", nothing, {"session": "nobody"}),
    ("a turn not running", nothing, {"turn_id": "nothing"}),
    ("events already written", nothing, {"events": [NewEvent(2, "turn.started", {})]}),
]


@pytest.mark.parametrize(("name", "setup", "changed"), END_CASES, ids=[c[0] for c in END_CASES])
async def test_an_ending_that_lets_go_writes_and_answers_what_three_steps_did(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    setup: Setup,
    changed: dict[str, Any],
) -> None:
    monkeypatch.setattr(time, "time", lambda: NOW)
    store = SQLiteStore(tmp_path / "t.db")
    await store.open()
    db = sqlite3.connect(tmp_path / "t.db")
    shorter = turns._end_released
    try:
        answers = {}
        for owner, way in (("alpha-owner", shorter), ("beta-owner", three_steps)):
            key = SessionKey("acme", owner, "s")
            await store.create_session(key, "assistant")
            with db:
                db.execute("UPDATE sessions SET lease_token = 100 WHERE owner = ?", (owner,))
            turn, lease, _ = await store.enqueue_turn_taken(
                key, owner="me", ttl=30, turn_id=f"run-{owner}", input="hi", policy="enqueue",
                items=[NewItem("user", "hi")], events=[NewEvent(2, "turn.started", {})],
            )  # fmt: skip
            assert lease is not None
            await setup(store, db, key)
            monkeypatch.setattr(turns, "_end_released", way)
            if "token" in changed:
                lease = Lease(key, "me", changed["token"], lease.expires_at)
            if "session" in changed:
                lease = Lease(SessionKey("acme", owner, changed["session"]), "me", lease.token, 0)
            try:
                ended, released = await store.end_turn_released(
                    lease,
                    changed.get("turn_id", turn.id),
                    changed.get("ending", TurnEnding("completed", "answered", output="x")),
                    changed.get("items", ANSWER),
                    changed.get("events", ENDED),
                )
                answer: Any = repr(({k: v for k, v in asdict(ended).items() if k != "key"},
                                    released)).replace(owner, "OWNER")  # fmt: skip
            except Exception as exc:
                answer = (type(exc).__name__, str(exc).replace(owner, "OWNER"))
            answers[owner] = (answer, dump(db, owner))
        assert answers["alpha-owner"] == answers["beta-owner"], name
    finally:
        db.close()
        await store.close()
