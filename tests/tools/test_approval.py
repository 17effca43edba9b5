"""Approval fails closed (DESIGN §1.4, §7): a timeout, an approver that raises or answers anything
but ``True`` all refuse, and the tool does not run. Only an explicit ``True`` runs it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from tests.helpers import all_items, assert_paired
from tether import Agent, tool
from tether.models.base import ModelRequest
from tether.records import Item, Turn
from tether.runtime import Runtime
from tether.server.approvals import Approvals
from tether.store.protocol import Store
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools.approval import REFUSED_RESULT, ApprovalRequest, Approver

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
    agent = Agent(
        name="a", model=ScriptedModel(default=_flow), tools=[launch], approval_timeout=0.05
    )
    async with Runtime(store, agents=[agent], approver=approver) as rt:
        turn = await rt.submit(agent, "go", session_id="s")
        done = await rt.scheduler.wait(turn.key, turn.id)
        items = await all_items(rt, turn.key)
    return done, items


def _answer(value: object) -> Approver:
    async def approver(request: ApprovalRequest) -> bool:
        return value  # type: ignore[return-value]  # what a careless approver may return

    return approver


async def _raises(request: ApprovalRequest) -> bool:
    raise RuntimeError("the approval service is down")


def _refused(done: Turn, items: list[Item]) -> None:
    assert done.status == "completed"  # a refusal is the model's business, not the turn's
    assert_paired(items)
    result = next(i for i in items if i.kind == "tool_result")
    assert result.content == REFUSED_RESULT and result.meta["error"] is True
    assert done.output == f"tool said: {REFUSED_RESULT}"
    assert ran == []


async def test_an_approval_nobody_gives_in_time_refuses(store: Store) -> None:
    approvals = Approvals()  # the server's: waits for a POST …/decisions that never comes
    done, items = await _run(store, approvals)
    _refused(done, items)
    # The wait is over: a decision arriving now is too late and runs nothing.
    call_id = next(i.call_id for i in items if i.kind == "tool_call")
    assert call_id is not None
    assert approvals.decide(done.id, call_id, True) is False
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
