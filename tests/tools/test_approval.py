"""Approval fails closed (DESIGN §1.4, §7): a deadline passing, an approver that raises or answers
anything but ``True`` all refuse, and the tool does not run. Only an explicit ``True`` runs it.

The approver here is the old in-process callback (``Runtime(approver=...)``): it now answers the
Decision the turn parks on, through the runtime's ``settle``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.helpers import all_items, assert_paired
from tether import Agent, tool
from tether.errors import DecisionMade
from tether.models.base import ModelRequest
from tether.records import Item, Turn
from tether.runtime import Runtime
from tether.store.protocol import Store
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools.approval import EXPIRED_RESULT, REFUSED_RESULT, ApprovalRequest, Approver

ran: list[str] = []


@tool(requires_approval=True)
def launch(target: str) -> str:
    """Launch something (needs a human's approval)."""
    ran.append(target)
    return f"launched {target}"


def _flow(request: ModelRequest) -> str | ToolCalls:
    if request.messages[-1].role == "tool":
        return f"tool said: {request.messages[-1].content}"
    return ToolCalls(Call("launch", {"target": "rocket"}))


async def _run(store: Store, approver: Approver) -> tuple[Turn, list[Item]]:
    ran.clear()
    agent = Agent(name="a", model=ScriptedModel(default=_flow), tools=[launch])
    async with Runtime(store, agents=[agent], approver=approver) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        done = await rt.settle(turn)
        items = await all_items(rt, turn.key)
    return done, items


def _answer(value: object) -> Approver:
    async def approver(request: ApprovalRequest) -> bool:
        return value  # type: ignore[return-value]  # what a careless approver may return

    return approver


async def _raises(request: ApprovalRequest) -> bool:
    raise RuntimeError("the approval service is down")


def _refused(done: Turn, items: list[Item], text: str = REFUSED_RESULT) -> None:
    assert done.status == "completed"  # a refusal is the model's business, not the turn's
    assert_paired(items)
    result = next(i for i in items if i.kind == "tool_result")
    assert result.content == text and result.meta["error"] is True
    assert done.output == f"tool said: {text}"
    assert ran == []


async def test_an_approval_nobody_gives_in_time_refuses(store: Store) -> None:
    ran.clear()
    agent = Agent(
        name="a", model=ScriptedModel(default=_flow), tools=[launch], approval_timeout=0.05
    )
    async with Runtime(store, agents=[agent]) as rt:  # nobody here to decide
        turn = await rt.submit(agent, "go", session_id="s")
        done = await rt.scheduler.wait(turn.key, turn.id)  # through the wait, to the end
        items = await all_items(rt, turn.key)
        _refused(done, items, EXPIRED_RESULT)
        # The deadline passed: a decision arriving now is too late and runs nothing.
        call_id = next(i.call_id for i in items if i.kind == "tool_call")
        assert call_id is not None
        with pytest.raises(DecisionMade) as late:
            await rt.decide(turn.key, turn.id, call_id, "approve")
        assert late.value.decision.status == "expired"
    assert ran == []


@pytest.mark.parametrize(
    "approver",
    [_raises, _answer(False), _answer(None), _answer("yes"), _answer(1)],
    ids=["raises", "false", "none", "truthy-string", "truthy-int"],
)
async def test_an_approver_that_errs_or_does_not_say_true_refuses(
    store: Store, approver: Callable[[ApprovalRequest], Awaitable[bool]]
) -> None:
    done, items = await _run(store, approver)
    _refused(done, items)


async def test_an_explicit_true_runs_the_tool(store: Store) -> None:
    done, items = await _run(store, _answer(True))
    assert done.output == "tool said: launched rocket"
    assert [i.content for i in items if i.kind == "tool_result"] == ["launched rocket"]
    assert ran == ["rocket"]
