"""Ownership: a session id means something only inside its owner's namespace.

Two users with API keys share one server. Whatever B does with A's session id, B learns nothing
(the answer is byte for byte the one for an id that does not exist) and changes nothing.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server.cli_keys import Key, assert_problem, create_key
from tests.server.conftest import Server


@pytest.fixture(scope="module")
def keys(server: Server) -> dict[str, Key]:
    """Keys for users A and B on the module's server (created while it runs)."""
    return {user: create_key(server.data_dir, user) for user in ("A", "B")}


@pytest.fixture
def alice(server: Server, keys: dict[str, Key]) -> Iterator[httpx.Client]:
    with server.client(keys["A"].secret) as c:
        yield c


@pytest.fixture
def bob(server: Server, keys: dict[str, Key]) -> Iterator[httpx.Client]:
    with server.client(keys["B"].secret) as c:
        yield c


def new_id(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create(c: httpx.Client, sid: str, agent: str = "echo") -> dict[str, Any]:
    r = c.post("/v1/sessions", json={"agent": agent, "session_id": sid})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def say(c: httpx.Client, sid: str, text: str) -> str:
    r = c.post(f"/v1/sessions/{sid}/turns", json={"input": text})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    output: str = r.json()["output"]
    return output


def snapshot(c: httpx.Client, sid: str) -> dict[str, Any]:
    """Everything a caller can read about one session."""
    parts = {
        "session": c.get(f"/v1/sessions/{sid}"),
        "items": c.get(f"/v1/sessions/{sid}/items", params={"limit": 1000}),
        "turns": c.get(f"/v1/sessions/{sid}/turns", params={"limit": 500}),
    }
    for r in parts.values():
        assert r.status_code == 200, r.text
    return {name: r.json() for name, r in parts.items()}


def foreign_requests(sid: str, tid: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every endpoint that names a session (and turn), with a body that would be valid."""
    base = f"/v1/sessions/{sid}"
    return [
        ("GET", base, None),
        ("PATCH", base, {"metadata": {"owner": "B"}, "state": {"x": 1}, "ttl_seconds": 5}),
        ("DELETE", f"{base}/items", None),
        ("GET", f"{base}/items", None),
        ("POST", f"{base}/turns", {"input": "B was here"}),
        ("POST", f"{base}/turns", {"input": "B was here", "wait": False}),
        ("POST", f"{base}/turns", {"input": "B was here", "stream": True}),
        ("POST", f"{base}/turns", {"input": "B was here", "policy": "rollback"}),
        ("GET", f"{base}/turns", None),
        ("GET", f"{base}/turns/{tid}", None),
        ("GET", f"{base}/turns/{tid}/events", None),
        ("POST", f"{base}/turns/{tid}/cancel", None),
        ("POST", f"{base}/turns/{tid}/decisions", {"call_id": "call_x", "approve": True}),
        ("POST", f"{base}/turns/{tid}/decisions", {"call_id": "call_x", "decision": "deny"}),
        ("GET", f"{base}/turns/{tid}/decisions", None),
        ("GET", f"{base}/decisions", None),
        ("GET", f"{base}/decisions?status=pending", None),
        ("DELETE", base, None),
    ]


def test_foreign_session_is_indistinguishable_from_unknown_on_every_endpoint(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    sid = new_id("mine")
    create(alice, sid)
    assert say(alice, sid, "a secret") == "saw [] then a secret"
    tid = alice.get(f"/v1/sessions/{sid}/turns").json()["data"][0]["id"]
    before = snapshot(alice, sid)

    unknown_sid, unknown_tid = new_id("nobody"), "t_doesnotexist0000"
    for (method, path, body), (_, unknown_path, _) in zip(
        foreign_requests(sid, tid), foreign_requests(unknown_sid, unknown_tid), strict=True
    ):
        foreign = bob.request(method, path, json=body)
        unknown = bob.request(method, unknown_path, json=body)
        assert_problem(foreign, 404, "not-found")
        assert (foreign.status_code, foreign.headers["content-type"], foreign.content) == (
            unknown.status_code,
            unknown.headers["content-type"],
            unknown.content,
        ), (method, path)

    assert snapshot(alice, sid) == before


def test_a_turn_id_only_exists_under_its_own_session(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    mine, other = new_id("mine"), new_id("other")
    create(alice, mine)
    create(alice, other)
    create(bob, mine)
    say(alice, other, "hello")
    say(bob, mine, "hello")
    for owner, sid in ((alice, other), (bob, mine)):
        tid = owner.get(f"/v1/sessions/{sid}/turns").json()["data"][0]["id"]
        for suffix in ("", "/events"):
            # A's session ``mine`` has no turn ``tid``: neither A's other session's nor B's.
            r = alice.get(f"/v1/sessions/{mine}/turns/{tid}{suffix}")
            unknown = alice.get(f"/v1/sessions/{mine}/turns/t_doesnotexist0000{suffix}")
            assert_problem(r, 404, "not-found")
            assert r.content == unknown.content
        r = alice.post(f"/v1/sessions/{mine}/turns/{tid}/cancel")
        assert_problem(r, 404, "not-found")
    assert alice.get(f"/v1/sessions/{mine}").json()["turn_count"] == 0


def test_chat_with_a_foreign_session_id_mints_the_callers_own_session(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    sid = new_id("chat")
    r = alice.post("/api/chat", json={"message": "a1 private", "session_id": sid})
    assert r.status_code == 200, r.text
    assert r.json()["response"] == "saw [] then a1 private"
    before = snapshot(alice, sid)

    r = bob.post("/api/chat", json={"message": "b1", "session_id": sid})
    assert r.status_code == 200, r.text
    assert {k: v for k, v in r.json().items() if k != "turn_id"} == {
        "response": "saw [] then b1",
        "agent_name": "echo",
        "session_id": sid,
    }
    r = bob.post("/api/chat", json={"message": "b2", "session_id": sid})
    assert r.json()["response"] == "saw [b1] then b2"

    assert snapshot(alice, sid) == before
    r = alice.post("/api/chat", json={"message": "a2", "session_id": sid})
    assert r.json()["response"] == "saw [a1 private] then a2"
    bobs = [i["content"] for i in bob.get(f"/v1/sessions/{sid}/items").json()["data"]]
    assert bobs == ["b1", "saw [] then b1", "b2", "saw [b1] then b2"]


def test_the_same_session_id_is_two_sessions_for_two_users(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    sid = new_id("alice")
    assert create(alice, sid)["session_id"] == sid
    assert create(bob, sid)["session_id"] == sid  # no 409: B has no session of that id
    assert say(alice, sid, "a1") == "saw [] then a1"
    assert say(bob, sid, "b1") == "saw [] then b1"
    assert say(alice, sid, "a2") == "saw [a1] then a2"
    assert say(bob, sid, "b2") == "saw [b1] then b2"
    # Deleting B's session leaves A's alone.
    assert bob.delete(f"/v1/sessions/{sid}").status_code == 204
    assert_problem(bob.get(f"/v1/sessions/{sid}"), 404, "not-found")
    assert alice.get(f"/v1/sessions/{sid}").json()["item_count"] == 4


@pytest.mark.parametrize(("first", "second"), [("a_b", "a.b"), ("s-1", "s-10"), ("x:y", "x-y")])
def test_similar_ids_are_distinct_sessions(alice: httpx.Client, first: str, second: str) -> None:
    tag = uuid.uuid4().hex[:8]
    one, two = f"{tag}{first}", f"{tag}{second}"
    create(alice, one)
    create(alice, two)
    assert say(alice, one, "to one") == "saw [] then to one"
    assert say(alice, two, "to two") == "saw [] then to two"
    assert say(alice, one, "one again") == "saw [to one] then one again"
    assert say(alice, two, "two again") == "saw [to two] then two again"
    for sid, word in ((one, "one"), (two, "two")):
        items = alice.get(f"/v1/sessions/{sid}/items").json()["data"]
        assert [i["content"] for i in items if i["kind"] == "user"] == [
            f"to {word}",
            f"{word} again",
        ]
    assert alice.get(f"/v1/sessions/{one}").json()["session_id"] == one


def test_listing_shows_only_the_callers_sessions_and_pages_without_duplicates(
    server: Server,
) -> None:
    carol, dave = create_key(server.data_dir, "carol"), create_key(server.data_dir, "dave")
    with server.client(carol.secret) as c, server.client(dave.secret) as d:
        mine = {create(c, new_id("c"))["session_id"] for _ in range(7)}
        theirs = {create(d, new_id("d"))["session_id"] for _ in range(3)}
        create(d, next(iter(mine)))  # the same id in D's namespace is D's

        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": 3}
            if cursor is not None:
                params["cursor"] = cursor
            r = c.get("/v1/sessions", params=params)
            assert r.status_code == 200, r.text
            page = r.json()
            assert len(page["data"]) <= 3
            seen += [s["session_id"] for s in page["data"]]
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3
        assert len(seen) == len(set(seen)) == 7
        assert set(seen) == mine
        assert seen == sorted(seen)
        listed = {s["session_id"] for s in d.get("/v1/sessions").json()["data"]}
        assert listed == theirs | {next(iter(mine))}


def test_server_generated_session_ids_are_unguessable(alice: httpx.Client) -> None:
    ids = []
    for _ in range(100):
        r = alice.post("/v1/sessions", json={"agent": "echo"})
        assert r.status_code == 201, r.text
        ids.append(r.json()["session_id"])
    for _ in range(3):
        r = alice.post("/api/chat", json={"message": "hi"})
        ids.append(r.json()["session_id"])
    assert len(set(ids)) == len(ids)
    # Count the bits the ids carry, position by position: a position where n symbols were seen
    # carries about ceil(log2(n)) bits (a fixed prefix, a counter's high digits: none).
    shortest = min(len(i) for i in ids)
    bits = sum(math.ceil(math.log2(len({i[pos] for i in ids}))) for pos in range(shortest))
    assert bits >= 128, (ids[:3], bits)


def test_an_expired_session_is_gone_for_its_owner_too(alice: httpx.Client) -> None:
    sid = new_id("ttl")
    r = alice.post("/v1/sessions", json={"agent": "echo", "session_id": sid, "ttl_seconds": 0.3})
    assert r.status_code == 201, r.text
    assert say(alice, sid, "old news") == "saw [] then old news"
    unknown = alice.get(f"/v1/sessions/{new_id('nobody')}")
    give_up = time.monotonic() + 10
    while alice.get(f"/v1/sessions/{sid}").status_code == 200:
        assert time.monotonic() < give_up, "the session never expired"
        time.sleep(0.05)
    gone = alice.get(f"/v1/sessions/{sid}")
    assert gone.content == unknown.content
    # A turn sent to it is refused as one sent to no session (the admission finds it expired).
    turn_gone = alice.post(f"/v1/sessions/{sid}/turns", json={"input": "again"})
    turn_unknown = alice.post(f"/v1/sessions/{new_id('nobody')}/turns", json={"input": "again"})
    assert turn_gone.status_code == 404 and turn_gone.content == turn_unknown.content
    assert sid not in {s["session_id"] for s in alice.get("/v1/sessions").json()["data"]}
    # Reusing the id starts afresh: the expired history is not revived.
    r = alice.post("/api/chat", json={"message": "new", "session_id": sid})
    assert r.status_code == 200, r.text
    assert r.json()["response"] == "saw [] then new"
    assert alice.get(f"/v1/sessions/{sid}").json()["expires_at"] is None
