"""Forgetting on SQLite while the store is busy: the deletion answers once it has committed,
and the write-ahead log is emptied of it by a checkpoint of its own (outside any other caller's
transaction), retried until it truncates."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tether.records import Namespace, NewEvent, NewItem, SessionKey, TurnEnding
from tether.store import SQLiteStore
from tether.store.sqlite import connection
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


async def test_forget_while_another_user_writes_answers_and_leaves_no_trace(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tether.db"
    store = SQLiteStore(path)
    await store.open()
    try:
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
    finally:
        await store.close()


async def test_a_checkpoint_held_off_by_a_reader_is_retried_until_the_wal_is_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connection, "CHECKPOINT_LATER", 0.05, raising=False)
    path = tmp_path / "tether.db"
    store = SQLiteStore(path)
    await store.open()
    reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        canary = "zqxalphaheldcanary"
        await seed_alice(store, canary)
        # Another process reading an old snapshot: no checkpoint can fold the WAL past it.
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM memory").fetchone()
        report = await asyncio.wait_for(store.forget_user("acme", "alice"), NO_HANG)
        assert report.sessions == 1  # answered: the deletion committed
        assert canary.encode() in await asyncio.to_thread(database_bytes, path)

        reader.execute("COMMIT")
        # The retries in the background: they end once the WAL is truncated.
        later: set[asyncio.Task[None]] = getattr(store, "_later", set())
        await asyncio.wait_for(asyncio.gather(*later), NO_HANG)
        assert (tmp_path / "tether.db-wal").stat().st_size == 0
        assert canary.encode() not in await asyncio.to_thread(database_bytes, path)
    finally:
        reader.close()
        await store.close()


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
