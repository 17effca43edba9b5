"""The doorbell between processes on one SQLite file: another's commit rings, ours does not.

Stores opened twice on one file stand for two processes (each has its own connection, its own
thread and its own doorbell); one test uses a real second process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tether.records import Namespace, SessionKey
from tether.store.sqlite import SQLiteStore
from tether.store.sqlite.doorbell import peers_dir
from tether.testing.conformance._support import put

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the doorbell is Linux's abstract sockets"
)


async def _rung(store: SQLiteStore, after: int) -> int:
    async with asyncio.timeout(5):
        await store.hear(after)
    heard = store.heard()
    assert heard is not None
    return heard


async def test_a_commit_rings_the_other_stores_on_the_file_and_not_its_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    mine, theirs = SQLiteStore(path), SQLiteStore(path)
    await mine.open()
    await theirs.open()
    try:
        assert mine.heard() == 0 and theirs.heard() == 0
        await theirs.create_session(SessionKey("t", "u", "s1"), "a")
        assert await _rung(mine, 0) >= 1
        assert theirs.heard() == 0  # its own commit is no news to it
        # What the ring said is what the data version tells: another process wrote.
        before = await mine.data_version()
        heard = mine.heard()
        assert heard is not None
        await mine.create_session(SessionKey("t", "u", "s2"), "a")
        await asyncio.sleep(0.1)
        assert mine.heard() == heard
        assert await mine.data_version() == before
        # A read rings nobody.
        await theirs.get_session(SessionKey("t", "u", "s1"))
        await asyncio.sleep(0.1)
        assert mine.heard() == heard
    finally:
        await mine.close()
        await theirs.close()


async def test_closing_a_store_leaves_no_registration(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    assert len(os.listdir(peers_dir(path))) == 1
    await store.close()
    assert os.listdir(peers_dir(path)) == []
    assert store.heard() is None  # closed: nothing to hear, pollers look for themselves


async def test_a_registration_left_by_a_killed_process_is_removed_by_the_next_ring(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    dead = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    assert await dead.wait() == 0  # a process that is gone: its pid names nobody now
    stale = f"{dead.pid}-0123456789ab"
    peers_dir(path).mkdir()
    (peers_dir(path) / stale).touch()  # what a listener killed with -9 leaves behind
    store = SQLiteStore(path)
    await store.open()
    try:
        await store.create_session(SessionKey("t", "u", "s"), "a")  # a commit rings it
        assert stale not in os.listdir(peers_dir(path))
        assert len(os.listdir(peers_dir(path))) == 1  # the store's own
    finally:
        await store.close()


async def test_a_store_that_cannot_register_says_it_hears_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    peers_dir(path).write_text("not a directory")  # the registrations cannot be made
    store = SQLiteStore(path)
    await store.open()
    try:
        assert store.heard() is None  # so the scheduler polls the data version, as before
        async with asyncio.timeout(1):
            await store.hear(0)  # and waiting for a ring returns at once
        await store.create_session(SessionKey("t", "u", "s"), "a")  # and commits still work
    finally:
        await store.close()


_COMMIT = """
import asyncio, sys
from tether.records import SessionKey
from tether.store.sqlite import SQLiteStore

async def main() -> None:
    store = SQLiteStore(sys.argv[1])
    await store.open()
    await store.create_session(SessionKey("t", "u", "from-afar"), "a")
    await store.close()

asyncio.run(main())
"""


async def test_another_process_commit_rings_this_one(tmp_path: Path) -> None:
    """The CLI (or any process that only writes) rings the listeners without listening."""
    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    await store.open()
    try:
        before = await store.data_version()
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _COMMIT, str(path))
        assert await proc.wait() == 0
        assert await _rung(store, 0) >= 1
        assert await store.data_version() != before
    finally:
        await store.close()


# -- memory versions, read once -----------------------------------------------------------------
ALICE = Namespace.user("acme", "alice")


def _counted_calls(store: SQLiteStore) -> list[int]:
    """Counts the calls that reach the store's thread."""
    calls = [0]
    worker = store._worker
    assert worker is not None
    call = worker.call

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return await call(*args, **kwargs)

    worker.call = counted  # type: ignore[method-assign]
    return calls


async def test_memory_versions_are_read_once_until_something_may_have_moved_them(
    tmp_path: Path,
) -> None:
    """A turn that recalls asks for its namespaces' versions (to skip a search of nothing):
    asked again with nothing written, the answer costs no call to the store's thread; after a
    write here, or another process's, it is read again, and never stale."""
    path = tmp_path / "t.db"
    mine, theirs = SQLiteStore(path), SQLiteStore(path)
    await mine.open()
    await theirs.open()
    try:
        calls = _counted_calls(mine)
        assert await mine.vector_versions([ALICE], collection="") == [0]
        assert await mine.vector_versions([ALICE], collection="") == [0]
        assert calls[0] == 1
        await put(mine, ALICE, "m1")  # written here
        ours = await mine.vector_versions([ALICE], collection="")
        assert ours[0] > 0
        await put(theirs, ALICE, "m2")  # written by another process: nothing of ours ran since
        theirs_too = await mine.vector_versions([ALICE], collection="")
        assert theirs_too[0] > ours[0]
        reads = calls[0]
        assert await mine.vector_versions([ALICE], collection="") == theirs_too
        assert calls[0] == reads  # and answered from memory again
        await theirs.forget_user("acme", "alice")  # its versions deleted, not bumped
        assert await mine.vector_versions([ALICE], collection="") == [0]
    finally:
        await mine.close()
        await theirs.close()


async def test_a_store_nobody_can_ring_reads_the_memory_versions_every_time(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    peers_dir(path).write_text("not a directory")
    store = SQLiteStore(path)
    await store.open()
    try:
        calls = _counted_calls(store)
        for _ in range(3):
            assert await store.vector_versions([ALICE], collection="") == [0]
        assert calls[0] == 3  # another process's write could not be heard of
    finally:
        await store.close()
