"""What only the SQLite backend promises: a durable WAL file, versioned migrations, and
fencing that holds across connections (as between two processes on one file)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from tether.errors import LimitExceeded, StaleLease, StoreError
from tether.records import NewEvent, NewItem, PrincipalLimits, SessionKey, TurnEnding
from tether.store import SQLiteStore
from tether.store.sqlite import queries as q
from tether.store.sqlite.migrations import MIGRATIONS, statements

KEY = SessionKey("acme", "alice", "s1")


def _query(path: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def _execute(path: Path, sql: str, args: tuple[object, ...]) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute(sql, args)
    finally:
        conn.close()


async def query(path: Path, sql: str) -> list[tuple[object, ...]]:
    return await asyncio.to_thread(_query, path, sql)


async def test_data_survives_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    await store.create_session(KEY, "assistant", metadata={"topic": "tax"})
    await store.update_session(KEY, state={"step": 3})
    await store.enqueue_turn(KEY, turn_id="t1", input="hello", policy="enqueue")
    lease = await store.acquire_lease(KEY, "node-a", 0.05)
    assert lease is not None
    await store.start_turn(
        lease, "t1", [NewItem("user", "hello")], [NewEvent(2, "turn.started", {})]
    )
    await store.end_turn(
        lease,
        "t1",
        TurnEnding("completed", "answered", output="hi", complete=True),
        [NewItem("assistant", "hi")],
        [NewEvent(3, "turn.ended", {})],
    )
    await store.enqueue_turn(KEY, turn_id="t2", input="more", policy="enqueue")
    session = await store.get_session(KEY)
    items = await store.list_items(KEY)
    turns = await store.list_turns(KEY)
    events = await store.list_events(KEY, "t1")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError):
        await store.get_session(KEY)

    reopened = SQLiteStore(path)
    await reopened.open()
    try:
        assert await reopened.get_session(KEY) == session
        assert await reopened.list_items(KEY) == items
        assert await reopened.list_turns(KEY) == turns
        assert await reopened.list_events(KEY, "t1") == events
        assert await reopened.sessions_needing_work() == [KEY]
        # The fencing counter is durable too: a later owner's token is still higher.
        await asyncio.sleep(0.15)
        later = await reopened.acquire_lease(KEY, "node-b", 30)
        assert later is not None and later.token > lease.token
    finally:
        await reopened.close()


async def test_file_is_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.create_session(KEY, "assistant")
        assert await query(path, "PRAGMA journal_mode") == [("wal",)]
    finally:
        await store.close()


async def test_migrations_are_recorded_and_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    expected = [(version,) for version, _ in MIGRATIONS]
    store = SQLiteStore(path)
    await store.open()
    await store.create_session(KEY, "assistant")
    await store.close()
    assert await query(path, "SELECT version FROM schema_version ORDER BY version") == expected

    # Reopening must not run a migration again (it would fail on existing tables, or
    # duplicate the version rows) and must keep the data.
    for _ in range(2):
        again = SQLiteStore(path)
        await again.open()
        try:
            assert await again.get_session(KEY) is not None
        finally:
            await again.close()
    assert await query(path, "SELECT version FROM schema_version ORDER BY version") == expected


def _at_version_8(path: Path) -> None:
    """A file as the release before migration 9 left it: alice has a queued turn on s1, a
    running one with one queued behind it on s2, a parked one on s3 and an ended one on s4;
    bob has a queued one."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for version, sql in MIGRATIONS[:8]:
            assert version <= 8
            for statement in statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        turns = {
            ("alice", "s1"): ["queued"],
            ("alice", "s2"): ["running", "queued"],
            ("alice", "s3"): ["awaiting_input"],
            ("alice", "s4"): ["done"],
            ("bob", "s1"): ["queued"],
        }
        for pk, ((owner, sid), statuses) in enumerate(turns.items(), start=1):
            conn.execute(
                "INSERT INTO sessions (pk, tenant, owner, session_id, agent, created_at,"
                " updated_at) VALUES (?, 'acme', ?, ?, 'assistant', 0, 0)",
                (pk, owner, sid),
            )
            for seq, status in enumerate(statuses, start=1):
                _insert_old_turn(conn, f"{owner}-{sid}-{seq}", pk, seq, status)
    finally:
        conn.close()


def _insert_old_turn(
    conn: sqlite3.Connection, turn_id: str, pk: int, seq: int, status: str
) -> None:
    """A turn inserted as the release before migration 9 inserts one (no tenant or owner)."""
    conn.execute(
        "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at)"
        " VALUES (?, ?, ?, 'x', 'enqueue', ?, 0)",
        (turn_id, pk, seq, status),
    )


def _owner_active(path: Path, owner: str) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        busy, total = conn.execute(q.OWNER_ACTIVE, ("acme", owner)).fetchone()
        return int(busy), int(total)
    finally:
        conn.close()


async def test_an_upgraded_file_counts_the_turns_under_way_it_already_had(tmp_path: Path) -> None:
    # Migration 9 counts an owner's turns by an index of its own; the turns already there, and
    # any a process of the previous release inserts afterwards, count as they did.
    path = tmp_path / "t.db"
    _at_version_8(path)
    store = SQLiteStore(path)
    await store.open()
    try:
        # Queued and running turns count, parked and ended ones do not, bob's are bob's.
        assert _owner_active(path, "alice") == (2, 3)
        assert _owner_active(path, "bob") == (1, 1)
        # The admission's bounds read the same: two sessions busy, one turn waiting.
        idle = SessionKey("acme", "alice", "s5")
        await store.create_session(idle, "assistant")
        with pytest.raises(LimitExceeded):
            await store.enqueue_turn(
                idle,
                turn_id="t5",
                input="x",
                policy="enqueue",
                limits=PrincipalLimits(running_turns=2),
            )
        with pytest.raises(LimitExceeded):
            await store.enqueue_turn(
                SessionKey("acme", "alice", "s1"),
                turn_id="t6",
                input="x",
                policy="enqueue",
                limits=PrincipalLimits(queued_turns=1),
            )
        # A turn the previous release inserts on the same file counts too; it ends as usual.
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            _insert_old_turn(conn, "old", 4, 2, "queued")
            assert _owner_active(path, "alice") == (3, 4)
            conn.execute("UPDATE turns SET status = 'cancelled' WHERE id = 'old'")
        finally:
            conn.close()
        assert _owner_active(path, "alice") == (2, 3)
        # A queued turn cancelled leaves its session idle.
        await store.end_waiting_turn(SessionKey("acme", "alice", "s1"), "alice-s1-1", "cancelled")
        assert _owner_active(path, "alice") == (1, 2)
        admitted = await store.enqueue_turn(
            idle,
            turn_id="t7",
            input="x",
            policy="enqueue",
            limits=PrincipalLimits(running_turns=2),
        )
        assert admitted.status == "queued"
        assert _owner_active(path, "alice") == (2, 3)
    finally:
        await store.close()


async def test_a_ttl_the_previous_release_sets_on_an_idle_session_is_its_own(
    tmp_path: Path,
) -> None:
    # During a rolling upgrade an older process may give a one-off session a TTL with its own
    # UPDATE (which knows nothing of idle_ttl): the TTL is the session's from then on, and
    # the session's later activity does not move it.
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.create_session(KEY, "assistant", ttl_seconds=1000, idle=True)
        until = time.time() + 60
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute(
                "UPDATE sessions SET metadata = '{}', state = '{}', expires_at = ?,"
                " updated_at = ?, revision = revision + 1"
                " WHERE tenant = ? AND owner = ? AND session_id = ?",
                (until, time.time(), KEY.tenant, KEY.owner, KEY.session_id),
            )
        finally:
            conn.close()
        record = await store.get_session(KEY)
        assert record is not None and record.expires_at == until
        await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        lease = await store.acquire_lease(KEY, "node-a", 30)
        assert lease is not None
        await store.start_turn(lease, "t1", [NewItem("user", "x")], [])
        after = await store.get_session(KEY)
        assert after is not None and after.expires_at == until
        assert after.updated_at > record.updated_at
    finally:
        await store.close()


async def test_two_stores_on_one_file_share_state_and_fence_each_other(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    a, b = SQLiteStore(path), SQLiteStore(path)
    await a.open()
    await b.open()
    try:
        await a.create_session(KEY, "assistant")
        assert await b.get_session(KEY) is not None
        await b.enqueue_turn(KEY, turn_id="t1", input="hello", policy="enqueue")

        lease_a = await a.acquire_lease(KEY, "node-a", 0.05)
        assert lease_a is not None
        assert await b.acquire_lease(KEY, "node-b", 30) is None
        assert await b.lease_holder(KEY) == "node-a"
        await a.start_turn(
            lease_a, "t1", [NewItem("user", "hello")], [NewEvent(2, "turn.started", {})]
        )
        await a.append(lease_a, "t1", [NewItem("tool_call", call_id="c1", tool_name="f")], [])
        assert [i.kind for i in await b.list_items(KEY)] == ["user", "tool_call"]

        await asyncio.sleep(0.15)
        lease_b = await b.acquire_lease(KEY, "node-b", 30)
        assert lease_b is not None and lease_b.token > lease_a.token
        assert await a.lease_holder(KEY) == "node-b"
        assert await a.acquire_lease(KEY, "node-a", 30) is None

        before = await b.list_items(KEY)
        with pytest.raises(StaleLease):
            await a.append(lease_a, "t1", [NewItem("assistant", "zombie")], [])
        with pytest.raises(StaleLease):
            await a.end_turn(lease_a, "t1", TurnEnding("completed", "answered"), [], [])
        assert await a.renew_leases([lease_a], 30) == []
        assert await b.list_items(KEY) == before

        (recovered,) = await b.recover(lease_b)
        assert (recovered.status, recovered.reason) == ("failed", "owner_lost")
        turn = await a.get_turn(KEY, "t1")
        assert turn is not None and turn.status == "failed"
        assert [i.kind for i in await a.list_items(KEY)] == ["user", "tool_call", "tool_result"]
    finally:
        await a.close()
        await b.close()


def _database_bytes(folder: Path) -> bytes:
    """The database file and whatever sits beside it (WAL, shared memory)."""
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.name.startswith("tether.db"))


async def test_forget_user_leaves_no_trace_in_the_database_files(tmp_path: Path) -> None:
    """After a forget, the user's text is in neither the database file nor its WAL."""
    from tether import Agent
    from tether.memory.service import MemoryService
    from tether.records import Namespace, Principal
    from tether.runtime import Runtime
    from tether.testing import EchoModel

    agent = Agent(name="a", model=EchoModel(), memory={"scopes": ["session", "user"]})
    canary_a, canary_b = "zqxalphacanary", "zqxbravocanary"
    alice, bob = Principal("acme", "alice"), Principal("acme", "bob")
    path = tmp_path / "tether.db"
    async with Runtime(SQLiteStore(path), agents=[agent]) as rt:
        for who, canary in ((alice, canary_a), (bob, canary_b)):
            await rt.chat(agent, f"My code word is {canary}", session_id="s", principal=who)
            await rt.memory.add(who, f"Remember {canary} always.", scope="user")
            await rt.memory.add_document(
                who, "docs", f"Manual about {canary}.".encode(), name="m.md"
            )
        memory = MemoryService(rt.store)
        report = await memory.forget_user("acme", "alice")
        assert report.sessions == 1 and report.documents == 1
        assert await rt.store.list_memory([Namespace.user("acme", "alice")]) == []
    raw = _database_bytes(tmp_path)
    assert canary_a.encode() not in raw
    assert canary_b.encode() in raw  # Bob's data is still there (and the check can see text)


async def test_a_cancel_request_of_an_older_release_still_cancels_and_blocks_no_other(
    tmp_path: Path,
) -> None:
    # During a rolling upgrade an older process may leave a request this release would not
    # write ("interrupt by turn …" as its reason): it must still end its turn, and must not
    # keep the other turns' requests from being read with it.
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        other = SessionKey("acme", "alice", "s2")
        for key, turn_id in ((KEY, "t1"), (other, "t2")):
            await store.create_session(key, "assistant")
            await store.enqueue_turn(key, turn_id=turn_id, input="x", policy="enqueue")
            lease = await store.acquire_lease(key, "node-a", 30)
            assert lease is not None
            await store.start_turn(lease, turn_id, [], [])
        assert await store.request_cancel(other, "t2", "cancelled", "cancelled")
        old = '{"status": "interrupted", "reason": "interrupt by turn t_9"}'
        await asyncio.to_thread(
            _execute, path, "UPDATE turns SET cancel_request = ? WHERE id = ?", (old, "t1")
        )
        assert await store.cancel_requests(["t1", "t2"]) == {
            "t1": ("interrupted", "interrupt"),
            "t2": ("cancelled", "cancelled"),
        }
    finally:
        await store.close()


async def test_the_data_version_moves_for_other_processes_writes_only(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    mine, theirs = SQLiteStore(path), SQLiteStore(path)
    await mine.open()
    await theirs.open()
    try:
        before = await mine.data_version()
        await mine.create_session(KEY, "a")  # our own write: our pollers hear of it in-process
        assert await mine.data_version() == before
        await theirs.create_session(SessionKey("acme", "bob", "s2"), "a")
        moved = await mine.data_version()
        assert moved != before
        assert await mine.data_version() == moved  # and stays until they write again
        # The version as the thread saw it before its last batch, for no I/O: it follows
        # their writes once a call of ours has run since, never ours.
        assert mine.seen_version() == moved
        await mine.create_session(SessionKey("acme", "alice", "s3"), "a")
        await mine.get_session(KEY)
        assert mine.seen_version() == moved
        await theirs.create_session(SessionKey("acme", "bob", "s4"), "a")
        assert mine.seen_version() == moved  # nothing of ours has run since: not seen yet
        await mine.get_session(KEY)
        assert mine.seen_version() != moved
        assert mine.seen_version() == await mine.data_version()
    finally:
        await mine.close()
        await theirs.close()


_SWITCH = """
import sqlite3, sys, time
from tether.store.sqlite.connection import _use_wal

conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
while time.time() < float(sys.argv[2]):
    pass
_use_wal(conn)
print(conn.execute("PRAGMA journal_mode").fetchone()[0])
"""


@pytest.mark.slow
def test_processes_switching_a_fresh_file_to_wal_at_once_all_get_there(tmp_path: Path) -> None:
    """SQLite refuses the switch to WAL at once ("database is locked", no busy handler) to all
    but one of the processes making it together; each must get there anyway."""
    import subprocess
    import sys
    import time

    from tests.server.conftest import PYTHONPATH

    env = {"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"}
    for round_ in range(5):
        db = tmp_path / f"fresh-{round_}.db"
        start = time.time() + 1.0  # after every interpreter has started
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _SWITCH, str(db), str(start)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(4)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [err.decode()[-300:] for _, err in outs]
        assert [out.decode().strip() for out, _ in outs] == ["wal"] * 4


async def test_a_new_file_and_directory_are_the_owners_alone(tmp_path: Path) -> None:
    # Every user's history and memory are in the file: before, it was made 0644 (and its
    # -wal and -shm with it) under the usual umask, readable by every account on the host.
    path = tmp_path / "data" / "t.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.create_session(KEY, "assistant")
        made = [path, path.with_name("t.db-wal"), path.with_name("t.db-shm")]
        assert {p.name: oct(p.stat().st_mode & 0o777) for p in made} == {
            p.name: "0o600" for p in made
        }
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    finally:
        await store.close()
    # A file that exists keeps the mode its owner gave it.
    path.chmod(0o640)
    again = SQLiteStore(path)
    await again.open()
    try:
        assert await again.get_session(KEY) is not None
        assert oct(path.stat().st_mode & 0o777) == "0o640"
    finally:
        await again.close()
