"""``DELETE /v1/users/me/data`` on SQLite while another user keeps writing.

Reproduce (from the repository root)::

    .venv/bin/python bench/forget_busy.py               # 10 forgets, 3 writing threads
    .venv/bin/python bench/forget_busy.py --rounds 30 --writers 6
    .venv/bin/python bench/forget_busy.py --file-mb 200   # on a file grown to ~200 MB first

A real ``tether serve`` (the test apps' scripted ``echo`` agent) on SQLite in a temporary
directory, with API keys for ``alice`` and ``bob``. Bob's threads write memory items and do
turns back to back for the whole run. Each round, Alice gets a session with a turn, a memory
item and a document, all carrying a word of their own, and then deletes all her data. For each
forget the script records what the client got and how long it took, and whether Alice's word
is still in the database file or in its write-ahead log right after the answer. A forget
rewrites the file (``VACUUM``), so its time grows with the file: ``--file-mb`` grows it first
with turns of a third user (written through the store, before the server starts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from _serve import serve as run_server
from tether.keys import mint_key
from tether.records import NewItem, SessionKey, TurnEnding
from tether.store import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]


def make_keys(path: Path) -> dict[str, str]:
    async def make() -> dict[str, str]:
        store = SQLiteStore(path)
        await store.open()
        try:
            out = {}
            for user in ("alice", "bob"):
                new = mint_key(user, "acme")
                await store.create_api_key(new.record)
                out[user] = new.secret
            return out
        finally:
            await store.close()

    return asyncio.run(make())


def grow(path: Path, mb: int) -> None:
    """Turns of ``carol`` (a 2 KB answer each) until the file holds about ``mb`` MB."""

    async def fill() -> None:
        store = SQLiteStore(path)
        await store.open()
        try:
            key = SessionKey("acme", "carol", "filler")
            await store.create_session(key, "assistant")
            lease = await store.acquire_lease(key, "bench", 3600)
            assert lease is not None
            reply, n = "word " * 400, 0
            while file_bytes(path) < mb * 1_000_000:
                tid = f"t{n}"
                await store.enqueue_turn(key, turn_id=tid, input="hi", policy="enqueue")
                await store.start_turn(lease, tid, [NewItem("user", "hi")], [])
                ending = TurnEnding("completed", "answered", output=reply, complete=True)
                await store.end_turn(lease, tid, ending, [NewItem("assistant", reply)], [])
                n += 1
        finally:
            await store.close()

    asyncio.run(fill())


def file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def serve(data_dir: Path) -> contextlib.AbstractContextManager[str]:
    return run_server(data_dir, data_dir / "server.log")


def bob(url: str, key: str, n: int, stop: threading.Event, got: Counter[int]) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
        c.post("/v1/sessions", json={"agent": "echo", "session_id": f"bob-{n}"})
        i = 0
        while not stop.is_set():
            got[c.post("/v1/memory", json={"content": f"bob {n}.{i} note"}).status_code] += 1
            r = c.post(f"/v1/sessions/bob-{n}/turns", json={"input": f"bob says {i}"})
            got[r.status_code] += 1
            i += 1


def seed(c: httpx.Client, word: str) -> None:
    sid = f"s-{word}"
    c.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
    c.post(f"/v1/sessions/{sid}/turns", json={"input": f"my word is {word}"})
    c.post("/v1/memory", json={"content": f"Alice's word is {word}"})
    doc = f"# notes\n\nThe word is {word}.\n".encode()
    c.post("/v1/knowledge/notes/documents", files={"file": ("n.md", doc)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--file-mb", type=int, default=0, help="grow the file to this first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tether-forget-") as tmp:
        data = Path(tmp)
        db = data / "tether.db"
        keys = make_keys(db)
        if args.file_mb:
            grow(db, args.file_mb)
        size = file_bytes(db)
        with serve(data) as url:
            stop, bob_got = threading.Event(), Counter[int]()
            threads = [
                threading.Thread(target=bob, args=(url, keys["bob"], n, stop, bob_got))
                for n in range(args.writers)
            ]
            for t in threads:
                t.start()
            got: Counter[str] = Counter()
            seconds: list[float] = []
            in_db = in_wal = 0
            headers = {"Authorization": f"Bearer {keys['alice']}"}
            with httpx.Client(base_url=url, headers=headers, timeout=60) as alice:
                for n in range(args.rounds):
                    word = f"zqxalpha{n}canary".encode()
                    seed(alice, word.decode())
                    start = time.monotonic()
                    try:
                        got[str(alice.delete("/v1/users/me/data").status_code)] += 1
                    except httpx.TimeoutException:
                        got["timeout"] += 1
                    seconds.append(time.monotonic() - start)
                    in_db += word in db.read_bytes()
                    wal = db.with_name(db.name + "-wal")
                    in_wal += wal.exists() and word in wal.read_bytes()
            stop.set()
            for t in threads:
                t.join()
    print(
        f"{args.rounds} forgets while {args.writers} threads of another user write"
        f" (file {size / 1e6:.0f} MB at the start):"
    )
    print(f"  DELETE /v1/users/me/data answered: {dict(got)}")
    print(
        f"  time to answer: p50 {statistics.median(seconds) * 1000:.0f} ms, "
        f"max {max(seconds) * 1000:.0f} ms"
    )
    print(f"  forgotten word still in the database file after the answer: {in_db}/{args.rounds}")
    print(f"  forgotten word still in the WAL file after the answer:      {in_wal}/{args.rounds}")
    print(f"  the other user's requests answered: {dict(bob_got)}")


if __name__ == "__main__":
    main()
