"""Human decisions over HTTP from the Python side (issue 11): ``/api/chat``'s 202, the client's
``on_decision``, and a remote ``Session`` that gets ``DecisionRequired`` and decides later."""

from __future__ import annotations

import asyncio
import time
from contextlib import closing
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server
from tether import Session
from tether.client import AsyncClient, Client
from tether.errors import DecisionMade, DecisionRequired
from tether.records import Decision
from tether.runtime import DecisionAnswer
from tether.tools.approval import REFUSED_RESULT

PICK = {"question": "Which planet?", "choices": ["Mars", "Venus"], "agent": "asker"}

pytestmark = pytest.mark.slow


def ended(c: httpx.Client, sid: str, tid: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        turn: dict[str, Any] = c.get(f"/v1/sessions/{sid}/turns/{tid}").json()
        if turn["status"] not in ("queued", "running", "awaiting_input"):
            return turn
        assert time.monotonic() < deadline, turn
        time.sleep(0.05)


def test_api_chat_answers_202_while_the_turn_waits(server: Server) -> None:
    with server.client() as c:
        r = c.post("/api/chat", json={"message": "pick", "agent_name": "asker", "session_id": "ac"})
        assert r.status_code == 202, r.text
        body = r.json()
        assert set(body) == {"status", "turn_id", "session_id", "agent_name", "decisions", "behind"}
        assert body["behind"] is None  # it asks itself (not queued behind another that asks)
        assert (body["status"], body["session_id"], body["agent_name"]) == (
            "awaiting_input",
            "ac",
            "asker",
        )
        tid = body["turn_id"]
        assert r.headers["Location"] == f"/v1/sessions/ac/turns/{tid}"
        [d] = body["decisions"]
        assert (d["kind"], d["payload"], d["status"]) == ("question", PICK, "pending")
        made = c.post(
            f"/v1/sessions/ac/turns/{tid}/decisions",
            json={"call_id": d["call_id"], "decision": "answer", "answer": "Mars"},
        )
        assert made.status_code == 200, made.text
        turn = ended(c, "ac", tid)
        assert (turn["status"], turn["output"]) == ("completed", "noted: The user answered: Mars")
        # A turn that asks nothing answers as PraisonAI's contract says, on the same session.
        r = c.post("/api/chat", json={"message": "hi", "agent_name": "echo", "session_id": "ac"})
        assert r.status_code == 200, r.text
        # (and names the turn that answered: tether's one addition)
        assert set(r.json()) == {"response", "agent_name", "session_id", "turn_id"}


def test_the_client_answers_ask_user_with_on_decision(server: Server) -> None:
    asked: list[Decision] = []

    def pick(d: Decision) -> DecisionAnswer:
        asked.append(d)
        return "Venus"

    with Client(server.url) as client:
        reply = client.chat("pick", session_id="cq", agent_name="asker", on_decision=pick)
        assert reply == {
            "response": "noted: The user answered: Venus",
            "agent_name": "asker",
            "session_id": "cq",
            "turn_id": reply["turn_id"],
        }
        assert reply["turn_id"].startswith("t_")
        [d] = asked
        assert (d.kind, d.payload, d.key.session_id) == ("question", PICK, "cq")
        # Free text for a question without choices.
        reply = client.chat(
            "hello", session_id="cq", agent_name="asker", on_decision=lambda d: "Ada"
        )
        assert reply["response"] == "noted: The user answered: Ada"
        [first, second] = client.decisions("cq")
        assert (first.status, first.answer, second.answer) == ("answered", "Venus", "Ada")
        assert client.decisions("cq", status="pending") == []


async def test_the_async_client_answers_with_an_async_callback(server: Server) -> None:
    async def pick(d: Decision) -> DecisionAnswer:
        return "Mars"

    async with AsyncClient(server.url) as client:
        reply = await client.chat("pick", session_id="cqa", agent_name="asker", on_decision=pick)
        assert reply["response"] == "noted: The user answered: Mars"
        # A sync callback works from the async client too (it runs on a thread).
        reply = await client.chat(
            "pick", session_id="cqa", agent_name="asker", on_decision=lambda d: "Venus"
        )
        assert reply["response"] == "noted: The user answered: Venus"


def test_a_refusal_through_the_client_never_runs_the_tool(server: Server) -> None:
    with Client(server.url) as client:
        reply = client.chat(
            "launch", session_id="cr", agent_name="approver", on_decision=lambda d: False
        )
        assert reply["response"] == f"tool said: {REFUSED_RESULT}"

        # A callback that raises refuses too (fail closed).
        def broken(d: Decision) -> DecisionAnswer:
            raise RuntimeError("no terminal")

        reply = client.chat("launch", session_id="cr", agent_name="approver", on_decision=broken)
        assert reply["response"] == f"tool said: {REFUSED_RESULT}"
        reply = client.chat(
            "launch", session_id="cr", agent_name="approver", on_decision=lambda d: True
        )
        assert reply["response"] == "tool said: launched rocket"
    with server.client() as c:
        items = c.get("/v1/sessions/cr/items").json()["data"]
    results = [i["content"] for i in items if i["kind"] == "tool_result"]
    assert results == [REFUSED_RESULT, REFUSED_RESULT, "launched rocket"]


def test_without_a_callback_decision_required_then_the_session_decides(server: Server) -> None:
    with closing(Session(agent_url=server.url, agent_name="asker", session_id="rs")) as remote:
        with pytest.raises(DecisionRequired) as waiting:
            remote.chat("pick")
        d = waiting.value.decision
        assert (d.kind, d.payload, d.status) == ("question", PICK, "pending")
        # Rebuilt from the wire: the session id is known, whose session it is only the server knows.
        assert (d.key.tenant, d.key.owner, d.key.session_id) == ("", "", "rs")
        assert [p.call_id for p in remote.decisions()] == [d.call_id]
        with server.client() as c:
            assert c.get(f"/v1/sessions/rs/turns/{d.turn_id}").json()["status"] == "awaiting_input"
        assert remote.decide(d, answer="Venus") == "noted: The user answered: Venus"
        # Deciding it again is refused with what was decided first.
        with pytest.raises(DecisionMade) as again:
            remote.decide(d, answer="Mars")
        assert (again.value.decision.status, again.value.decision.answer) == ("answered", "Venus")
        assert remote.decisions() == []


async def test_a_remote_session_decides_with_callbacks_sync_and_async(server: Server) -> None:
    with closing(Session(agent_url=server.url, agent_name="approver", session_id="rsa")) as remote:

        async def approve(d: Decision) -> DecisionAnswer:
            return "approve"

        assert await remote.achat("launch", on_decision=approve) == "tool said: launched rocket"
        with pytest.raises(DecisionRequired) as waiting:
            await remote.achat("launch")
        assert await remote.adecide(waiting.value.decision.call_id, "deny") == (
            f"tool said: {REFUSED_RESULT}"
        )
        # A callback that cannot decide (None) leaves it to someone else: DecisionRequired.
        with pytest.raises(DecisionRequired):
            await remote.achat("launch", on_decision=lambda d: None)
        [left] = remote.decisions()
        assert await remote.adecisions() == [left]
        assert remote.decide(left, "approve") == "tool said: launched rocket"
        assert await remote.adecisions() == []


async def test_a_message_behind_a_turn_that_waits_raises_or_decides_that_turns_decision(
    server: Server,
) -> None:
    # Before, the client followed only the new turn, which cannot start before the earlier one
    # is decided: chat() waited for ever, with or without on_decision.
    async with AsyncClient(server.url) as client:
        with pytest.raises(DecisionRequired) as first:
            await client.chat("pick", session_id="cb", agent_name="asker")
        with pytest.raises(DecisionRequired) as behind:
            await asyncio.wait_for(client.chat("hello", session_id="cb", agent_name="echo"), 20)
        waiting = behind.value.decision
        assert (waiting.turn_id, waiting.call_id) == (
            first.value.decision.turn_id,
            first.value.decision.call_id,
        )
        asked: list[Decision] = []

        def pick(d: Decision) -> DecisionAnswer:
            asked.append(d)
            return "Mars"

        reply = await asyncio.wait_for(
            client.chat("and then", session_id="cb", agent_name="echo", on_decision=pick), 20
        )
        assert [d.call_id for d in asked] == [waiting.call_id]
        assert reply["response"] == "saw [pick, hello] then and then"
    with closing(Session(agent_url=server.url, agent_name="asker", session_id="cb")) as remote:
        with pytest.raises(DecisionRequired):
            remote.chat("pick")
        with pytest.raises(DecisionRequired) as sync_behind:
            remote.chat("hi")
        assert sync_behind.value.decision.payload["question"] == PICK["question"]
