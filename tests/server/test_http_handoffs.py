"""Handoffs over HTTP (DESIGN §10): with the same isolation and order as any agent.

Twenty sessions at once, each handed by triage to billing or tech through ``/api/chat``: every
reply is its own session's, every history shows its own handoff, and two messages sent at
once to one session run one after the other.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server, start_server

pytestmark = pytest.mark.slow

SESSIONS = 20


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("desk"), target="tests.server.handoff_app:app")
    yield srv
    srv.stop()


async def _chat(client: httpx.AsyncClient, sid: str, message: str) -> dict[str, Any]:
    r = await client.post("/api/chat", json={"message": message, "session_id": sid})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def _conversation(client: httpx.AsyncClient, n: int) -> tuple[str, list[dict[str, Any]]]:
    sid = f"desk-{n}"
    topic = f"bill #{n}" if n % 2 == 0 else f"screen #{n}"
    first = await _chat(client, sid, topic)
    # Two at once on one session: they are queued, not interleaved.
    second, third = await asyncio.gather(
        _chat(client, sid, f"more #{n}"), _chat(client, sid, f"again #{n}")
    )
    return sid, [first, second, third]


def test_twenty_sessions_handed_off_at_once_stay_apart(desk: Server) -> None:
    async def run() -> list[tuple[str, list[dict[str, Any]]]]:
        async with httpx.AsyncClient(base_url=desk.url, timeout=60) as client:
            return await asyncio.gather(*(_conversation(client, n) for n in range(SESSIONS)))

    results = asyncio.run(run())
    with desk.client() as client:
        for n, (sid, replies) in enumerate(results):
            target, instructions = ("billing", "Billing.") if n % 2 == 0 else ("tech", "Tech.")
            topic = f"bill #{n}" if n % 2 == 0 else f"screen #{n}"
            first, *rest = replies
            # The specialist answered, and said so; it saw this session's messages only.
            assert first["agent_name"] == target and first["session_id"] == sid
            assert first["response"] == f"{instructions} saw: {topic}"
            for reply in rest:
                assert reply["agent_name"] == target
                assert reply["response"].startswith(f"{instructions} saw: {topic} | ")
                shown = reply["response"].split("saw: ", 1)[1].split(" | ")
                assert all(m.endswith(f"#{n}") for m in shown), reply
            # Whichever of the two concurrent messages ran second saw the other one.
            longer = max(rest, key=lambda r: len(r["response"]))
            assert len(longer["response"].split(" | ")) == 3

            items = client.get(f"/v1/sessions/{sid}/items").json()["data"]
            moves = [(i["agent"], i["content"]) for i in items if i["kind"] == "handoff"]
            assert moves == [("triage", target)]
            assert {i["agent"] for i in items if i["kind"] == "assistant"} == {target}
            turns = client.get(f"/v1/sessions/{sid}/turns").json()["data"]
            assert [t["status"] for t in turns] == ["completed"] * 3
            assert [(t["agent"], t["ran_by"]) for t in turns] == [("triage", target)] * 3
            # Serialized: each turn started after the one before it ended.
            for before, after in itertools.pairwise(turns):
                assert after["started_at"] >= before["ended_at"]


def test_the_native_api_hands_off_and_back(desk: Server) -> None:
    with desk.client() as client:
        r = client.post("/v1/sessions", json={"agent": "triage", "session_id": "native"})
        assert r.status_code == 201, r.text
        turns = "/v1/sessions/native/turns"
        first = client.post(turns, json={"input": "my bill"}).json()
        assert (first["status"], first["agent"], first["ran_by"]) == (
            "completed",
            "triage",
            "billing",
        )
        back = client.post(turns, json={"input": "back to triage please"}).json()
        assert (back["ran_by"], back["output"]) == (
            "triage",
            "triage: Transferred to triage. triage answers from here.",
        )
        hello = client.post(turns, json={"input": "hello"}).json()
        assert (hello["ran_by"], hello["output"].split(" saw:")[0]) == ("triage", "Triage.")
        # The handed-to agents are served and listed with the one that hands to them.
        listed = client.get("/v1/agents").json()["data"]
        assert [(a["name"], a["handoffs"]) for a in listed] == [
            ("triage", ["billing", "tech"]),
            ("billing", ["triage"]),
            ("tech", []),
        ]
        # The stream carries the handoff event.
        with client.stream("POST", turns, json={"input": "bill again", "stream": True}) as s:
            events = [
                line.split(": ", 1)[1] for line in s.iter_lines() if line.startswith("event:")
            ]
        assert "handoff" in events and events[-1] == "turn.ended"


def test_an_app_must_serve_what_its_agents_hand_off_to(tmp_path: Path) -> None:
    from tether import Agent, App, ConfigError

    with pytest.raises(ConfigError, match="not serve"):
        App(agents=[Agent(name="triage", handoffs=["billing"])])
    for bad in (None, Agent(name="one"), ["a name"]):
        with pytest.raises(ConfigError, match="agents"):
            App(agents=bad)  # type: ignore[arg-type]
    billing = Agent(name="billing", handoffs=["triage"])
    app = App(agents=[Agent(name="triage", handoffs=[billing])])
    assert [a.name for a in app.agents] == ["triage", "billing"]


def test_a_handed_to_agent_that_asks_is_named_in_the_202(desk: Server) -> None:
    with desk.client() as client:
        first = client.post("/api/chat", json={"message": "my bill", "session_id": "asks"})
        assert first.json()["agent_name"] == "billing"
        # Billing asks to refund: the 202 names billing, not triage the turn was sent to.
        waiting = client.post("/api/chat", json={"message": "refund it", "session_id": "asks"})
        assert waiting.status_code == 202, waiting.text
        body = waiting.json()
        assert (body["status"], body["agent_name"]) == ("awaiting_input", "billing")
        [d] = body["decisions"]
        assert (d["payload"]["tool"], d["payload"]["agent"]) == ("refund", "billing")
        # The remote-agent contract answers a waiting turn in its own shape.
        remote = client.post("/agent", json={"message": "another", "session_id": "asks"})
        assert remote.status_code == 202, remote.text
        reply = remote.json()
        assert reply["content"] == "" and reply["session_id"] == "asks"
        meta = reply["metadata"]
        assert (meta["status"], meta["agent_name"], meta["behind"]) == (
            "queued",
            "billing",
            body["turn_id"],
        )
        assert [x["call_id"] for x in meta["decisions"]] == [d["call_id"]]
        assert "complete" not in meta  # said of an ended reply only, and only when it was cut
        decided = client.post(
            f"/v1/sessions/asks/turns/{d['turn_id']}/decisions",
            json={"call_id": d["call_id"], "decision": "approve"},
        )
        assert decided.status_code == 200, decided.text
        done = _ended(client, f"/v1/sessions/asks/turns/{body['turn_id']}")
        assert (done["output"], done["ran_by"]) == ("Billing: refunded A1", "billing")


def _ended(client: httpx.Client, url: str, within: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        turn: dict[str, Any] = client.get(url).json()
        if turn["ended_at"] is not None:
            return turn
        time.sleep(0.05)
    raise AssertionError(f"{url} did not end in {within}s")
