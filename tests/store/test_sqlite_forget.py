"""Forgetting on SQLite while the store is busy: the deletion answers once it has committed,
and the write-ahead log is emptied of it by a checkpoint of its own (outside any other caller's
transaction), retried until it truncates."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tether.records import Namespace, NewEvent, NewItem, SessionKey, TurnEnding
from tether.store import SQLiteStore
from tether.store.sqlite import scrub
from tether.store.sqlite.scrub import Scrubber
from tether.testing.conformance._support import put

ALICE, BOB = Namespace.user("acme", "alice"), Namespace.user("acme", "bob")
NO_HANG = 30.0  # a guard against a hang, not a timing assertion


def database_bytes(path: Path) -> bytes:
    """The database file and whatever sits beside it (WAL, shared memory)."""
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


async def seed_alice(store: SQLiteStore, canary: str) -> None:
    key = SessionKey("acme", "alice", f"s-{canary}")
    await store.create_session(key, "assistant")
    await store.enqueue_turn(key, turn_id=f"t-{canary}", input=canary, policy="enqueue")
    lease = await store.acquire_lease(key, "node", 30)
    assert lease is not None
    await store.start_turn(lease, f"t-{canary}", [NewItem("user", f"my word is {canary}")], [])
    await put(store, ALICE, f"m-{canary}", f"Alice's word is {canary}")


@contextlib.asynccontextmanager
async def bob_writing(store: SQLiteStore, writers: int = 4) -> AsyncIterator[list[int]]:
    """Bob's writes, back to back from several tasks, for as long as the block runs."""
    done = asyncio.Event()
    written = [0]

    async def write(w: int) -> None:
        n = 0
        while not done.is_set():
            await put(store, BOB, f"b{w}-{n}", f"Bob's note {n} zqxbravocanary")
            n += 1
            written[0] += 1

    tasks = [asyncio.create_task(write(w)) for w in range(writers)]
    try:
        await asyncio.sleep(0.05)  # let the writes get going
        yield written
    finally:
        done.set()
        await asyncio.gather(*tasks)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    opened = SQLiteStore(tmp_path / "tether.db")
    await opened.open()
    yield opened
    await opened.close()  # again, for a test that closed it: closing twice is harmless


@pytest.fixture
def elsewhere(store: SQLiteStore) -> Iterator[sqlite3.Connection]:
    """Another connection to the store's file, as another process has."""
    conn = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    yield conn
    conn.close()


async def test_forget_while_another_user_writes_answers_and_leaves_no_trace(
    store: SQLiteStore,
) -> None:
    path = store.path
    canaries = [f"zqxalpha{n}canary" for n in range(5)]
    async with bob_writing(store) as written:
        for canary in canaries:
            await seed_alice(store, canary)
            report = await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
            assert report.sessions == 1 and report.memory >= 1
            # Done means gone from the files, with Bob still writing.
            raw = await asyncio.to_thread(database_bytes, path)
            assert canary.encode() not in raw
    assert written[0] > 0
    assert b"zqxbravocanary" in await asyncio.to_thread(database_bytes, path)
    assert await store.list_memory([ALICE]) == []


def scrubber(store: SQLiteStore) -> Scrubber:
    got = getattr(store, "_scrubber", None)
    assert isinstance(got, Scrubber)
    return got


async def retries_done(store: SQLiteStore) -> None:
    """Wait for the scrub's retries in the background, if any."""
    later = getattr(scrubber(store), "_later", None)
    if later is not None:
        await asyncio.wait_for(later, NO_HANG)


def wal_size(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The scrub's statements as they run (VACUUM, checkpoints); retries 50 ms apart."""
    ran: list[str] = []
    real = scrub._briefly

    def briefly(c: sqlite3.Connection, *, sql: str, busy_ms: int) -> tuple[Any, ...] | None:
        ran.append(sql.split()[0] if sql == "VACUUM" else "CHECKPOINT")
        return real(c, sql=sql, busy_ms=busy_ms)

    monkeypatch.setattr(scrub, "_briefly", briefly)
    monkeypatch.setattr(scrub, "LATER", 0.05)
    return ran


async def test_a_checkpoint_held_off_by_a_reader_is_retried_until_the_wal_is_empty(
    store: SQLiteStore, elsewhere: sqlite3.Connection, statements: list[str]
) -> None:
    path = store.path
    canary = "zqxalphaheldcanary"
    await seed_alice(store, canary)
    # Another process reading an old snapshot: no checkpoint can fold the WAL past it.
    elsewhere.execute("BEGIN")
    elsewhere.execute("SELECT COUNT(*) FROM memory").fetchone()
    report = await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
    assert report.sessions == 1  # answered: the deletion committed
    assert canary.encode() in await asyncio.to_thread(database_bytes, path)

    elsewhere.execute("COMMIT")
    await retries_done(store)  # they end once the WAL is truncated
    assert wal_size(path) == 0
    assert canary.encode() not in await asyncio.to_thread(database_bytes, path)
    assert statements.count("VACUUM") == 1  # rewritten once; then only checkpoints


async def test_a_forget_that_deleted_nothing_rewrites_nothing_and_forgets_at_once_share_one(
    store: SQLiteStore, statements: list[str]
) -> None:
    path = store.path
    report = await store.forget_user("acme", "nobody")
    assert (report.sessions, report.memory, report.documents) == (0, 0, 0)
    assert statements == []  # anyone may ask to be forgotten: that costs no rewrite
    users = [f"u{n}" for n in range(6)]
    for user in users:
        await put(store, Namespace.user("acme", user), f"m-{user}", f"{user}'s zqxnote")
    reports = await asyncio.gather(*(store.forget_user("acme", u) for u in users))
    assert all(r.memory == 1 for r in reports)
    # One rewrite for those that committed before it began, one more at most for the rest.
    assert 1 <= statements.count("VACUUM") <= 2, statements
    assert b"zqxnote" not in await asyncio.to_thread(database_bytes, path)


async def test_without_room_for_a_copy_the_wal_is_still_emptied_and_the_rewrite_waits(
    store: SQLiteStore, statements: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.path
    free = [0]
    monkeypatch.setattr(scrub, "_free", lambda _: free[0])
    canary = "zqxalpharoomcanary"
    await seed_alice(store, canary)
    await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
    assert "VACUUM" not in statements  # not tried: it would fill the disk and fail
    assert statements and wal_size(path) == 0  # the log is emptied all the same
    assert scrubber(store).pending
    free[0] = 1 << 40  # room again: the retries in the background rewrite it
    await retries_done(store)
    assert statements.count("VACUUM") == 1 and not scrubber(store).pending
    assert canary.encode() not in await asyncio.to_thread(database_bytes, path)


async def test_a_writer_elsewhere_holds_the_rewrite_off_until_it_commits(
    store: SQLiteStore,
    elsewhere: sqlite3.Connection,
    statements: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = store.path
    briefly = scrub._briefly

    def writer_first(c: sqlite3.Connection, *, sql: str, busy_ms: int) -> tuple[Any, ...] | None:
        if not elsewhere.in_transaction and "VACUUM" not in statements:
            # Another process begins a write as the forget's deletion has committed, and
            # holds it longer than the attempts made before the forget answers.
            elsewhere.execute("BEGIN IMMEDIATE")
        return briefly(c, sql=sql, busy_ms=busy_ms)

    monkeypatch.setattr(scrub, "_briefly", writer_first)
    canary = "zqxalphalockcanary"
    await seed_alice(store, canary)
    await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
    assert statements.count("VACUUM") == 6 and scrubber(store).pending  # all refused
    assert canary.encode() in await asyncio.to_thread(database_bytes, path)
    elsewhere.execute("COMMIT")
    await retries_done(store)
    assert not scrubber(store).pending and wal_size(path) == 0
    assert canary.encode() not in await asyncio.to_thread(database_bytes, path)


async def test_a_reader_holding_a_snapshot_gets_no_second_copy_of_the_file_in_the_wal(
    store: SQLiteStore, elsewhere: sqlite3.Connection, statements: list[str]
) -> None:
    path = store.path
    for n in range(200):  # a file of some size, so that a copy of it shows in the WAL
        await put(store, BOB, f"b-{n}", f"Bob's note {n} " + "pad " * 200)
    await seed_alice(store, "zqxalphaone")
    elsewhere.execute("BEGIN")
    elsewhere.execute("SELECT COUNT(*) FROM memory").fetchone()
    await store.forget_user("acme", "alice")
    after_one = wal_size(path)
    await seed_alice(store, "zqxalphatwo")
    await store.forget_user("acme", "alice")
    assert statements.count("VACUUM") == 1  # the first copy is still in the log
    assert wal_size(path) < after_one + path.stat().st_size // 2
    elsewhere.execute("COMMIT")
    await retries_done(store)
    assert statements.count("VACUUM") == 2 and not scrubber(store).pending
    raw = await asyncio.to_thread(database_bytes, path)
    assert b"zqxalphaone" not in raw and b"zqxalphatwo" not in raw


async def test_closing_the_store_mid_scrub_stops_the_retries_and_says_what_remains(
    store: SQLiteStore,
    elsewhere: sqlite3.Connection,
    statements: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await seed_alice(store, "zqxalphaclosed")
    elsewhere.execute("BEGIN")
    elsewhere.execute("SELECT COUNT(*) FROM memory").fetchone()
    await store.forget_user("acme", "alice")
    later = getattr(scrubber(store), "_later", None)
    assert later is not None and not later.done()
    with caplog.at_level(logging.ERROR, logger="tether.store"):
        await store.close()  # as `tether forget` does once it has answered
    assert later.done()
    assert "could not be scrubbed before the store closed" in caplog.text


async def test_a_forget_whose_scrub_the_store_closes_under_still_answers(
    store: SQLiteStore, elsewhere: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried = threading.Event()
    briefly = scrub._briefly

    def attempt(c: sqlite3.Connection, *, sql: str, busy_ms: int) -> tuple[Any, ...] | None:
        tried.set()
        return briefly(c, sql=sql, busy_ms=busy_ms)

    monkeypatch.setattr(scrub, "_briefly", attempt)
    await seed_alice(store, "zqxalphashutdown")
    elsewhere.execute("BEGIN")  # the attempts before answering go on for ~1 s
    elsewhere.execute("SELECT COUNT(*) FROM memory").fetchone()
    forget = asyncio.create_task(store.forget_user("acme", "alice"))
    assert await asyncio.to_thread(tried.wait, NO_HANG)
    await store.close()  # the server shuts down meanwhile
    report = await asyncio.wait_for(forget, NO_HANG)
    assert report.sessions == 1  # the deletion committed: the caller is told so


async def test_no_copy_of_a_row_left_behind_by_a_page_rebuild_outlives_the_forget(
    tmp_path: Path,
) -> None:
    """``secure_delete`` zeroes a row where it lives when it is deleted; a copy that a B-tree
    rebalance left in a page's unused space (the row, or an older version of it, moved to
    another page) is no row, so nothing zeroes it. Turns of Alice's and Bob's sessions are
    queued, started and ended in a shuffled order (each step grows a row of ``turns`` and
    moves its neighbours), then Alice is forgotten: no byte of hers may remain."""
    for seed in range(10):  # a copy is left behind by 3 or 4 of them on SQLite 3.40
        await forget_amid_rebalances(tmp_path / f"s{seed}" / "tether.db", seed)


async def forget_amid_rebalances(path: Path, seed: int) -> None:
    store = SQLiteStore(path)
    await store.open()
    try:
        rnd = random.Random(seed)
        keys = [SessionKey("acme", "alice", f"a{n}") for n in range(2)]
        keys += [SessionKey("acme", "bob", f"b{n}") for n in range(6)]
        leases = {}
        for k in keys:
            await store.create_session(k, "assistant")
            leases[k] = await store.acquire_lease(k, "node", 600)
        step: dict[SessionKey, tuple[str, str] | None] = dict.fromkeys(keys)
        canaries: list[str] = []
        for n in range(400):
            k = rnd.choice(keys)
            lease, at = leases[k], step[k]
            assert lease is not None
            word = f"zqxalpha{n:03d}canary" if k.owner == "alice" else f"bob's {n}"
            if at is None:
                canaries += [word] if k.owner == "alice" else []
                await store.enqueue_turn(k, turn_id=f"t{n}", input=word, policy="enqueue")
                step[k] = (f"t{n}", "queued")
            elif at[1] == "queued":
                start = [NewEvent(2, "turn.started", {})]
                await store.start_turn(lease, at[0], [NewItem("user", f"my word: {word}")], start)
                step[k] = (at[0], "running")
            else:
                reply = f"{word} " + "said " * rnd.randint(50, 300)
                await store.end_turn(
                    lease,
                    at[0],
                    TurnEnding("completed", "answered", output=reply, complete=True),
                    [NewItem("assistant", reply)],
                    [NewEvent(3, "turn.ended", {})],
                )
                step[k] = None
        report = await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
        assert report.sessions == 2
        raw = await asyncio.to_thread(database_bytes, path)
        left = [c for c in canaries if c.encode() in raw]
        assert left == [], f"seed {seed}: {len(left)} of {len(canaries)} forgotten words remain"
        assert b"bob's" in raw
    finally:
        await store.close()
