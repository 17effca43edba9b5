"""An embedded Session's human decisions (issue 11): ``chat(on_decision=)`` with a sync or async
callback, and ``DecisionRequired`` then ``Session.decide`` when nobody was there to ask."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import ConfigError, Session, TurnFailed, tool
from tether.errors import DecisionMade, DecisionNotFound, DecisionRequired
from tether.models.base import ModelRequest
from tether.records import Decision
from tether.runtime import DecisionAnswer
from tether.testing import ScriptedModel
from tether.testing.scripted import Call, ToolCalls

RUNS: list[str] = []


@tool(requires_approval=True)
def deploy(target: str) -> str:
    """Deploy something (a human approves it)."""
    RUNS.append(target)
    return f"deployed {target}"


def deploys(request: ModelRequest) -> str | ToolCalls:
    if request.messages[-1].role == "tool":
        return f"tool said: {request.messages[-1].content}"
    return ToolCalls(Call("deploy", {"target": "prod"}))


def asks(request: ModelRequest) -> str | ToolCalls:
    if request.messages[-1].role == "tool":
        return f"noted: {request.messages[-1].content}"
    return ToolCalls(Call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}))


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    RUNS.clear()
    yield tmp_path / "data"
    tether.embedded.shutdown()


def deployer(session: Session, name: str = "deployer") -> None:
    session.Agent(name=name, model=ScriptedModel(default=deploys), tools=[deploy])


def test_a_sync_callback_approves_and_the_tool_runs(data_dir: Path) -> None:
    session = Session(session_id="d-sync", user_id="ann")
    deployer(session)
    asked: list[Decision] = []

    def approve(d: Decision) -> DecisionAnswer:
        asked.append(d)
        return "approve"

    assert session.chat("ship it", on_decision=approve) == "tool said: deployed prod"
    assert RUNS == ["prod"]
    [d] = asked
    assert (d.kind, d.payload["tool"], d.status) == ("approval", "deploy", "pending")
    assert d.key == session.key
    [done] = session.decisions(status=None)
    assert (done.status, done.decided_by) == ("approved", "local")
    assert session.decisions() == []  # nothing pending any more


async def test_an_async_callback_refuses_and_the_tool_never_runs(data_dir: Path) -> None:
    session = Session(session_id="d-async", user_id="ann")
    deployer(session)

    async def refuse(d: Decision) -> DecisionAnswer:
        return False

    reply = await session.achat("ship it", on_decision=refuse)
    assert reply.startswith("tool said: Tool call refused")
    assert RUNS == []


def test_decision_required_then_decide_resumes_the_same_turn(data_dir: Path) -> None:
    session = Session(session_id="d-later", user_id="ann")
    deployer(session)
    assert session.decisions() == []  # not stored yet: nothing to decide (was SessionNotFound)
    with pytest.raises(DecisionRequired) as waiting:
        session.chat("ship it")
    d = waiting.value.decision
    assert (d.kind, d.payload["tool"]) == ("approval", "deploy")
    assert RUNS == []  # the tool waits for the decision
    assert [p.call_id for p in session.decisions()] == [d.call_id]
    assert session.decide(d) == "tool said: deployed prod"
    assert RUNS == ["prod"]
    # A second decision on it is refused with the first one; the tool ran once.
    with pytest.raises(DecisionMade) as again:
        session.decide(d, "deny")
    assert again.value.decision.status == "approved"
    assert RUNS == ["prod"]


def test_deciding_by_call_id_and_denying(data_dir: Path) -> None:
    session = Session(session_id="d-deny", user_id="ann")
    deployer(session)
    with pytest.raises(DecisionRequired) as waiting:
        session.chat("ship it")
    with pytest.raises(DecisionNotFound):
        session.decide("call_nobody_made")
    reply = session.decide(waiting.value.decision.call_id, "deny")
    assert reply.startswith("tool said: Tool call refused")
    assert RUNS == []


def test_ask_user_answered_through_decide(data_dir: Path) -> None:
    session = Session(session_id="d-ask", user_id="ann")
    session.Agent(name="asker", model=ScriptedModel(default=asks), ask_user=True)
    with pytest.raises(DecisionRequired) as waiting:
        session.chat("pick a colour")
    d = waiting.value.decision
    assert (d.kind, d.payload) == (
        "question",
        {"question": "Which colour?", "choices": ["red", "blue"], "agent": "asker"},
    )
    assert session.decide(d, answer="blue") == "noted: The user answered: blue"
    # And with a callback, which answers with the text.
    assert session.chat("again", on_decision=lambda d: "red") == "noted: The user answered: red"


async def test_adecide_resumes_and_asks_the_next_decision(data_dir: Path) -> None:
    session = Session(session_id="d-next", user_id="ann")
    deployer(session)
    with pytest.raises(DecisionRequired) as first:
        await session.achat("ship it")
    await session.adecide(first.value.decision, "deny")
    # A second turn waits too: decide() of it without a callback that approves fails on.
    with pytest.raises(DecisionRequired) as second:
        await session.achat("ship it again")
    assert second.value.decision.turn_id != first.value.decision.turn_id
    # Inside async code, what is pending is listed with the async twin (decisions() refuses).
    pending = await session.adecisions()
    assert [d.call_id for d in pending] == [second.value.decision.call_id]
    assert len(await session.adecisions(status=None)) == 2
    assert await session.adecide(second.value.decision.call_id) == "tool said: deployed prod"
    assert await session.adecisions() == []


def test_a_turn_that_does_not_complete_after_the_decision_is_turn_failed(data_dir: Path) -> None:
    session = Session(session_id="d-fail", user_id="ann")

    def then_fails(request: ModelRequest) -> str | ToolCalls:
        if request.messages[-1].role == "tool":
            raise RuntimeError("the model broke")
        return ToolCalls(Call("deploy", {"target": "prod"}))

    session.Agent(name="breaks", model=ScriptedModel(default=then_fails), tools=[deploy])
    with pytest.raises(DecisionRequired) as waiting:
        session.chat("ship it")
    with pytest.raises(TurnFailed) as failed:
        session.decide(waiting.value.decision)
    assert failed.value.turn.status == "failed"
    assert RUNS == ["prod"]


def test_decide_passes_the_reply_through_the_middleware(data_dir: Path) -> None:
    session = Session(session_id="d-mw", user_id="ann", middleware=[lambda m, r: "[REDACTED]"])
    deployer(session)
    with pytest.raises(DecisionRequired) as waiting:
        session.chat("ship it")
    reply = session.decide(waiting.value.decision)
    # As chat's replies are: a redaction middleware is not bypassed by a turn that asked.
    assert reply == "[REDACTED]" and RUNS == ["prod"]
    assert reply["metadata"]["turn_id"] == waiting.value.decision.turn_id
    assert (reply["metadata"]["agent_name"], reply["metadata"]["status"]) == (
        "deployer",
        "completed",
    )
    # The stored history keeps what the agent said.
    assert session.get_context()["messages"][-1]["content"] == "tool said: deployed prod"


def test_saving_a_state_keeps_what_the_session_approved_for_good(data_dir: Path) -> None:
    session = Session(session_id="d-always", user_id="ann")
    deployer(session)
    assert session.chat("ship it", on_decision=lambda d: "always") == "tool said: deployed prod"
    session.save_state({"cart": [1, 2]})
    assert session.restore_state() == {"cart": [1, 2], "always_approve": ["deploy"]}
    # Not asked again: saving a dict did not revoke "always".
    assert session.chat("ship it") == "tool said: deployed prod"
    assert RUNS == ["prod", "prod"]
    with pytest.raises(ConfigError, match="dict"):
        session.save_state([1, 2])  # type: ignore[arg-type]
