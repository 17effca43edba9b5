"""``DELETE /v1/users/me/data`` on a busy SQLite server: while another user keeps writing, the
forget answers 200 once its deletion has committed, and the forgotten text is gone from the
database file and its write-ahead log when it answers (the file rewritten: a copy of a row that
a page rebalance left behind under Bob's writes is no row, and ``secure_delete`` misses it)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, start_server
from tether.keys import mint_key
from tether.store import SQLiteStore


def make_keys(path: Path, users: list[str]) -> dict[str, str]:
    async def make() -> dict[str, str]:
        store = SQLiteStore(path)
        await store.open()
        try:
            out = {}
            for user in users:
                new = mint_key(user, "acme")
                await store.create_api_key(new.record)
                out[user] = new.secret
            return out
        finally:
            await store.close()

    return asyncio.run(make())


def database_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, dict[str, str]]]:
    data = tmp_path / "data"
    data.mkdir()
    keys = make_keys(data / "tether.db", ["alice", "bob"])
    srv = start_server(data)
    yield srv, keys
    srv.stop()


class BobWrites:
    """Bob's memory writes and turns, back to back from a few threads."""

    def __init__(self, server: Server, key: str, threads: int = 3) -> None:
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.threads = [
            threading.Thread(target=self._run, args=(server, key, n)) for n in range(threads)
        ]

    def _run(self, server: Server, key: str, n: int) -> None:
        with server.client(key, timeout=60) as c:
            sid = f"bob-{n}"
            r = c.post("/v1/sessions", json={"agent": "echo", "session_id": sid})
            self.statuses.append(r.status_code)
            i = 0
            while not self.stop.is_set():
                r = c.post("/v1/memory", json={"content": f"bob {n}.{i} zqxbravocanary"})
                self.statuses.append(r.status_code)
                r = c.post(f"/v1/sessions/{sid}/turns", json={"input": f"bob says {i}"})
                self.statuses.append(r.status_code)
                i += 1

    def __enter__(self) -> BobWrites:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def seed(c: httpx.Client, canary: str) -> None:
    sid = f"s-{uuid.uuid4().hex[:8]}"
    assert c.post("/v1/sessions", json={"agent": "echo", "session_id": sid}).status_code == 201
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": f"my word is {canary}"})
    assert r.status_code == 200, r.text
    r = c.post("/v1/memory", json={"content": f"Alice's word is {canary}"})
    assert r.status_code == 201, r.text
    doc = f"# notes\n\nThe word is {canary}.\n".encode()
    r = c.post("/v1/knowledge/notes/documents", files={"file": ("n.md", doc)})
    assert r.status_code == 201, r.text


def test_forget_me_while_another_user_writes_answers_200_and_leaves_no_trace(
    server: tuple[Server, dict[str, str]],
) -> None:
    srv, keys = server
    db = srv.data_dir / "tether.db"
    with srv.client(keys["alice"], timeout=60) as alice, BobWrites(srv, keys["bob"]) as bob:
        for n in range(4):
            canary = f"zqxalpha{n}canary"
            seed(alice, canary)
            r = alice.delete("/v1/users/me/data")
            assert r.status_code == 200, r.text
            report = r.json()
            assert report["sessions"] == 1 and report["documents"] == 1 and report["memory"] >= 2
            # (What the server logged says whether its scrub of the file was held off.)
            assert canary.encode() not in database_bytes(db), srv.output()[-2000:]
            assert alice.get("/v1/sessions").json()["data"] == []
    assert bob.statuses and set(bob.statuses) <= {200, 201}, sorted(set(bob.statuses))
    assert b"zqxbravocanary" in database_bytes(db)
