"""Over real HTTP: continuity, isolation under concurrency, serialization, honest failures."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, ServerFactory
from tether.keys import mint_key
from tether.store import SQLiteStore
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

pytestmark = pytest.mark.slow


def test_two_turn_continuity_on_api_chat(server: Server) -> None:
    with server.client() as c:
        first = c.post(
            "/api/chat",
            json={"message": "I am Ada", "session_id": "cont-chat", "agent_name": "echo"},
        )
        assert first.status_code == 200
        assert first.json() == {
            "response": "saw [] then I am Ada",
            "agent_name": "echo",
            "session_id": "cont-chat",
            "turn_id": first.json()["turn_id"],  # tether's addition to PraisonAI's shape
        }
        turn = c.get(f"/v1/sessions/cont-chat/turns/{first.json()['turn_id']}").json()
        assert turn["output"] == "saw [] then I am Ada"
        second = c.post(
            "/api/chat", json={"message": "who?", "session_id": "cont-chat", "agent_name": "echo"}
        ).json()
        assert second["response"] == "saw [I am Ada] then who?"
        # No session id: a fresh session every call, with a new unguessable id.
        a = c.post("/api/chat", json={"message": "x", "agent_name": "echo"}).json()
        b = c.post("/api/chat", json={"message": "y", "agent_name": "echo", "session_id": ""})
        assert a["response"] == "saw [] then x" and b.json()["response"] == "saw [] then y"
        assert a["session_id"] != b.json()["session_id"]


def test_two_turn_continuity_on_v1(server: Server) -> None:
    with server.client() as c:
        created = c.post("/v1/sessions", json={"agent": "echo", "session_id": "cont-v1"})
        assert created.status_code == 201
        one = c.post("/v1/sessions/cont-v1/turns", json={"input": "first"})
        assert one.status_code == 200 and one.json()["status"] == "completed"
        two = c.post("/v1/sessions/cont-v1/turns", json={"input": "second"}).json()
        assert two["output"] == "saw [first] then second" and two["seq"] == 2
        items = c.get("/v1/sessions/cont-v1/items").json()["data"]
        assert [(i["kind"], i["content"]) for i in items] == [
            ("user", "first"),
            ("assistant", "saw [] then first"),
            ("user", "second"),
            ("assistant", "saw [first] then second"),
        ]
        session = c.get("/v1/sessions/cont-v1").json()
        assert session["status"] == "idle" and session["item_count"] == 4
        assert session["turn_count"] == 2


def _keys(data_dir: Path, users: list[str]) -> dict[str, str]:
    """API keys for ``users``, written to the store before the server starts."""

    async def make() -> dict[str, str]:
        store = SQLiteStore(data_dir / "tether.db")
        await store.open()
        out = {}
        try:
            for user in users:
                new = mint_key(user, "acme")
                await store.create_api_key(new.record)
                out[user] = new.secret
        finally:
            await store.close()
        return out

    data_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(make())


def test_fifty_owners_concurrently_never_leak(make_server: ServerFactory, tmp_path: Path) -> None:
    users = [f"user{n:02d}" for n in range(50)]
    keys = _keys(tmp_path / "data0", users)
    srv = make_server()
    canary = {u: f"canary-{u}-{n * 104729:x}" for n, u in enumerate(users)}

    async def converse(client: httpx.AsyncClient, user: str) -> list[str]:
        replies = []
        for n in range(2):
            r = await client.post(
                "/api/chat",
                json={
                    "message": f"{canary[user]} #{n}",
                    "session_id": "same-id",
                    "agent_name": "echo",
                },
                headers={"Authorization": f"Bearer {keys[user]}"},
            )
            assert r.status_code == 200, r.text
            replies.append(r.json()["response"])
        return replies

    async def run() -> list[list[str]]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
            return await asyncio.gather(*(converse(client, u) for u in users))

    results = asyncio.run(run())
    for user, replies in zip(users, results, strict=True):
        assert replies[1] == f"saw [{canary[user]} #0] then {canary[user]} #1"
        text = " ".join(replies)
        assert [c for u, c in canary.items() if u != user and c in text] == []
    with srv.client() as c:
        for user in users:
            items = c.get(
                "/v1/sessions/same-id/items", headers={"Authorization": f"Bearer {keys[user]}"}
            ).json()["data"]
            stored = json.dumps(items)
            assert canary[user] in stored and len(items) == 4
            assert [u for u, can in canary.items() if u != user and can in stored] == []


def test_twenty_concurrent_requests_on_one_session_serialize(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/sessions", json={"agent": "echo", "session_id": "serial-20"})

    async def one(client: httpx.AsyncClient, n: int) -> dict[str, object]:
        r = await client.post("/v1/sessions/serial-20/turns", json={"input": f"m{n}"})
        assert r.status_code == 200, r.text
        body: dict[str, object] = r.json()
        return body

    async def run() -> list[dict[str, object]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(*(one(client, n) for n in range(20)))

    turns = asyncio.run(run())
    assert sorted(t["seq"] for t in turns) == list(range(1, 21))  # type: ignore[type-var]
    with server.client() as c:
        items = c.get("/v1/sessions/serial-20/items", params={"limit": 100}).json()["data"]
    assert [i["kind"] for i in items] == ["user", "assistant"] * 20
    earlier: list[str] = []
    for n in range(0, 40, 2):
        user, reply = items[n]["content"], items[n + 1]["content"]
        assert reply == f"saw [{', '.join(earlier)}] then {user}"
        earlier.append(user)


def test_reject_names_the_busy_turn(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/sessions", json={"agent": "slow", "session_id": "busy"})
        first = c.post("/v1/sessions/busy/turns", json={"input": "go", "wait": False})
        assert first.status_code == 202
        busy = c.post("/v1/sessions/busy/turns", json={"input": "me too", "policy": "reject"})
        assert busy.status_code == 409
        assert busy.headers["content-type"] == "application/problem+json"
        assert busy.json()["busy_turn_id"] == first.json()["id"]
        c.post(f"/v1/sessions/busy/turns/{first.json()['id']}/cancel")
        turns = c.get("/v1/sessions/busy/turns").json()["data"]
        assert [t["input"] for t in turns] == ["go"]


def test_failing_model_is_not_a_200(server: Server, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    with server.client() as c:
        r = c.post(
            "/api/chat",
            json={"message": "doomed", "session_id": "fail-1", "agent_name": "upstream"},
        )
        assert r.status_code == 502
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["turn"]["status"] == "failed" and body["turn"]["reason"] == "model_error"
        assert "Traceback" not in r.text
        ok = c.post(
            "/api/chat", json={"message": "again", "session_id": "fail-1", "agent_name": "upstream"}
        )
        assert ok.status_code == 200 and ok.json()["response"] == "fine now"
    sent = json.dumps(fake_openai.chat_requests[-1]["messages"])
    assert "doomed" not in sent and "melted" not in sent


@pytest.mark.real_model
def test_default_serve_answers_from_the_embedded_model(make_server: ServerFactory) -> None:
    """What `make serve` runs: no app, no configuration, the embedded model."""
    srv = make_server(target=None, env={"TETHER_MODEL": ""})
    with srv.client(timeout=120) as c:
        agents = c.get("/v1/agents").json()["data"]
        assert [(a["name"], a["model"]) for a in agents] == [("assistant", "local")]
        r = c.post("/api/chat", json={"message": "What is the capital of France?"})
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["response"]


def test_two_agents_of_the_app_serve_one_session(server: Server) -> None:
    # Each turn runs the agent it names (the models answer with their instructions): no 409
    # for the second agent, and never the first agent's instructions for the second's turn.
    with server.client() as c:
        chat = {"message": "find", "session_id": "duo", "agent_name": "researcher"}
        first = c.post("/api/chat", json=chat)
        assert first.status_code == 200 and first.json()["response"] == "You research topics."
        second = c.post("/api/chat", json={**chat, "agent_name": "writer"})
        assert second.status_code == 200, second.text
        assert second.json()["response"] == "You write articles."
        third = c.post("/v1/sessions/duo/turns", json={"input": "more", "agent": "writer"})
        assert third.json()["output"] == "You write articles."
        assert third.json()["agent"] == "writer"
        # Without a name a turn runs the session's own agent (the one that made it).
        own = c.post("/v1/sessions/duo/turns", json={"input": "and?"}).json()
        assert own["output"] == "You research topics." and own["agent"] == "researcher"
        # /api/chat too: no agent_name is the session's own agent, not the app's first one.
        writers = {"message": "draft", "session_id": "duo-w", "agent_name": "writer"}
        assert c.post("/api/chat", json=writers).json()["agent_name"] == "writer"
        again = c.post("/api/chat", json={"message": "more", "session_id": "duo-w"}).json()
        assert (again["agent_name"], again["response"]) == ("writer", "You write articles.")
        turns = c.get("/v1/sessions/duo/turns").json()["data"]
        assert [t["agent"] for t in turns] == ["researcher", "writer", "writer", "researcher"]
        unknown = c.post("/v1/sessions/duo/turns", json={"input": "x", "agent": "nobody"})
        assert unknown.status_code == 404
        assert "nobody" in unknown.json()["detail"] and "writer" in unknown.json()["agents"]


def test_session_memory_dies_with_its_session(server: Server) -> None:
    # The model answers with its system prompt, so a reply shows what the turn recalled.
    with server.client() as c:

        def fresh(sid: str, **body: object) -> None:
            r = c.post("/v1/sessions", json={"agent": "recaller", "session_id": sid, **body})
            assert r.status_code == 201, r.text

        def ask(sid: str, text: str) -> str:
            r = c.post(f"/v1/sessions/{sid}/turns", json={"input": text})
            assert r.status_code == 200, r.text
            return str(r.json()["output"])

        fresh("mem-del")
        ask("mem-del", "My name is Zebulon.")
        assert "Zebulon" in ask("mem-del", "What is my name?")
        # Deleted and made again under the same id: a new conversation that recalls nothing.
        assert c.delete("/v1/sessions/mem-del").status_code == 204
        fresh("mem-del")
        assert "Zebulon" not in ask("mem-del", "What is my name?")

        # Clearing the history clears the notes taken from it.
        fresh("mem-clear")
        ask("mem-clear", "My name is Quentin.")
        assert c.delete("/v1/sessions/mem-clear/items").status_code in (200, 204)
        # The turns' records and events held the same words: they go with the history.
        assert c.get("/v1/sessions/mem-clear/turns").json()["data"] == []
        assert "Quentin" not in ask("mem-clear", "What is my name?")

        # An expired session's id, taken again, starts empty too.
        fresh("mem-ttl", ttl_seconds=1)
        ask("mem-ttl", "My name is Ottoline.")
        deadline = time.monotonic() + 10
        while c.get("/v1/sessions/mem-ttl").status_code != 404 and time.monotonic() < deadline:
            time.sleep(0.2)
        fresh("mem-ttl")
        assert "Ottoline" not in ask("mem-ttl", "What is my name?")


def test_retries_with_one_idempotency_key_make_one_turn(server: Server) -> None:
    sid = "idem-1"
    with server.client() as c:
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": sid}).status_code == 201

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(base_url=server.url, timeout=30, trust_env=False) as ac:
            return await ac.post(
                f"/v1/sessions/{sid}/turns",
                json={"input": "only once"},
                headers={"Idempotency-Key": "order-42"},
            )

    async def ten() -> list[httpx.Response]:
        return await asyncio.gather(*(post() for _ in range(10)))

    answers = asyncio.run(ten())
    assert {r.status_code for r in answers} == {200}
    assert len({r.json()["id"] for r in answers}) == 1
    assert len({json.dumps(r.json(), sort_keys=True) for r in answers}) == 1
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        assert [t["input"] for t in turns] == ["only once"]
        # After it ended, a retry still gets it, in the body's field as in the header.
        late = c.post(
            f"/v1/sessions/{sid}/turns", json={"input": "only once", "idempotency_key": "order-42"}
        )
        assert late.json()["id"] == answers[0].json()["id"]
        other = c.post(
            f"/v1/sessions/{sid}/turns",
            json={"input": "something else"},
            headers={"Idempotency-Key": "order-42"},
        )
        assert other.status_code == 422 and other.json()["type"].endswith("idempotency-key-reused")
        both = c.post(
            f"/v1/sessions/{sid}/turns",
            json={"input": "x", "idempotency_key": "a"},
            headers={"Idempotency-Key": "b"},
        )
        assert both.status_code == 409
        assert len(c.get(f"/v1/sessions/{sid}/turns").json()["data"]) == 1


@pytest.mark.parametrize("path", ["/api/chat", "/agent", "/agents/echo"])
def test_the_chat_contracts_take_an_idempotency_key_too(server: Server, path: str) -> None:
    # Before, /api/chat and /agent ignored the header: a client's retry was a second turn.
    sid = "idem-chat-" + path.strip("/").replace("/", "-")
    headers = {"Idempotency-Key": "retry-me"}
    with server.client() as c:
        first = c.post(path, json={"message": "only once", "session_id": sid}, headers=headers)
        again = c.post(path, json={"message": "only once", "session_id": sid}, headers=headers)
        assert first.status_code == again.status_code == 200, (first.text, again.text)
        said = [first.json(), again.json()]
        assert len({body.get("turn_id") or body["metadata"]["turn_id"] for body in said}) == 1
        other = c.post(path, json={"message": "else", "session_id": sid}, headers=headers)
        assert other.status_code == 422 and other.json()["type"].endswith("idempotency-key-reused")
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        assert [t["input"] for t in turns] == ["only once"]


def test_the_turn_list_shows_what_a_waiting_turn_waits_for(server: Server) -> None:
    """As ``GET …/turns/{tid}`` does: the README says a turn's own ``decisions`` lists the
    pending ones it waits for, and the list said ``[]``."""
    with server.client() as c:
        assert c.post("/v1/sessions", json={"session_id": "listed", "agent": "approver"})
        parked = c.post("/v1/sessions/listed/turns", json={"input": "launch"}).json()
        assert parked["status"] == "awaiting_input"
        one = c.get(f"/v1/sessions/listed/turns/{parked['id']}").json()
        listed = c.get("/v1/sessions/listed/turns").json()["data"]
    assert [t["id"] for t in listed] == [parked["id"]]
    assert listed[0]["decisions"] == one["decisions"] != []
