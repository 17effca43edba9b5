"""Step 3 of a turn: run the tool calls the model asked for.

A tool's failure is the model's business, not the turn's: errors, timeouts, unknown tools,
invalid arguments and refusals all become a tool result the model reads.

Calls run in the order the model made them, except that consecutive calls of ``read_only``
tools run together: they change nothing, so no order among them can be observed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from tether.errors import InvalidInput, ToolError
from tether.events import TOOL_STARTED
from tether.loop.context import TurnContext
from tether.models.base import ToolCall
from tether.records import ABORTED_TOOL_RESULT, NewDecision
from tether.tools.approval import EXPIRED_RESULT, REFUSED_RESULT
from tether.tools.ask_user import ask_user
from tether.tools.context import ToolContext
from tether.tools.tool import Tool


class NeedsDecision(Exception):
    """Raised from a call that waits for a human: the loop parks the turn on ``decision``.

    Not part of the error tree: nothing failed, the turn is only waiting (DESIGN §3).
    """

    def __init__(self, call: ToolCall, decision: NewDecision) -> None:
        super().__init__(call.id)
        self.call = call
        self.decision = decision


async def run_calls(
    ctx: TurnContext, calls: Sequence[ToolCall]
) -> AsyncIterator[tuple[ToolCall, str, bool]]:
    """Run one step's calls; yields ``(call, result text, is_error)`` in the calls' order."""
    for batch in _batches(ctx, calls):
        if len(batch) == 1:
            outcomes = [await run_call(ctx, batch[0])]
        else:
            # A task group, not gather: on cancellation (or a bug) no call is left running.
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(run_call(ctx, call)) for call in batch]
            outcomes = [task.result() for task in tasks]
        for call, (text, is_error) in zip(batch, outcomes, strict=True):
            yield call, text, is_error


def _batches(ctx: TurnContext, calls: Sequence[ToolCall]) -> list[list[ToolCall]]:
    """Runs of consecutive read-only calls, and every other call on its own.

    A call that needs approval runs alone even when read-only: its human answers one question
    at a time.
    """
    batches: list[list[ToolCall]] = []
    together = False
    for call in calls:
        tool = ctx.tool_named(call.name)
        shareable = (
            tool is not None
            and tool.read_only
            and not tool.requires_approval
            and tool is not ask_user
        )
        if shareable and together:
            batches[-1].append(call)
        else:
            batches.append([call])
        together = shareable
    return batches


async def run_call(ctx: TurnContext, call: ToolCall) -> tuple[str, bool]:
    """Run one call; returns ``(result text, is_error)``."""
    tool = ctx.tool_named(call.name)
    if tool is None:
        offered = [s.name for s in ctx.specs()]
        names = ", ".join(offered) or "none"
        return f"Error: there is no tool named {call.name!r} (available: {names}).", True
    try:
        args = tool.parse_arguments(call.arguments)
    except InvalidInput as exc:
        return f"Error: {exc}", True
    decision = ctx.resumed.decisions.get(call.id) if ctx.resumed is not None else None
    if tool is ask_user and decision is None:
        payload = {"question": args["question"], "choices": args.get("choices")}
        raise NeedsDecision(call, _asked(ctx, call, "question", payload))
    if tool.requires_approval:
        # A decision recorded for this very call is final: an "always" given for the tool
        # while it waited (another call's, a state edit) never turns its denial or its
        # expiry into a run.
        if decision is None and tool.name not in ctx.always:
            payload = {"tool": call.name, "arguments": call.arguments}
            raise NeedsDecision(call, _asked(ctx, call, "approval", payload))
        if decision is not None and decision.status == "expired":
            return EXPIRED_RESULT, True
        if decision is not None and decision.status not in ("approved", "always"):
            return REFUSED_RESULT, True
    if tool.requires_approval or decision is not None:
        if ctx.resumed is not None and call.id in ctx.resumed.started_calls:
            # It began to run before (its process died mid-call): never a second run.
            return ABORTED_TOOL_RESULT, True
        # Durable before the tool runs: a crash mid-call then ends it aborted, never twice.
        ctx.sink.emit(TOOL_STARTED, {"call_id": call.id, "name": call.name})
        await ctx.sink.commit([])
    # The call's own stop signal, not the turn's: a timeout stops this call, and the turn goes
    # on. A sync tool's thread cannot be interrupted and runs on after its call is abandoned;
    # this flag is what tells it to stop.
    stop = asyncio.Event()
    if ctx.cancelled.is_set():
        stop.set()
    tool_ctx = ToolContext(
        session=ctx.key,
        principal=ctx.principal,
        turn_id=ctx.turn_id,
        call_id=call.id,
        cancelled=stop,
        workspace=ctx.workspace,
        workspace_quota=ctx.workspace_quota,
        memory=ctx.memory,
        decision=decision,
        skills=ctx.skills,
    )
    timeout = tool.timeout if tool.timeout is not None else ctx.agent.tool_timeout
    return await _invoke(tool, call, tool_ctx, timeout)


async def _invoke(
    tool: Tool, call: ToolCall, tool_ctx: ToolContext, seconds: float
) -> tuple[str, bool]:
    """The call's result within ``seconds``; past them, ``tool_ctx.cancelled`` is set."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await tool.invoke(call.arguments, tool_ctx), False
    except TimeoutError as exc:
        if not deadline.expired():  # the tool's own TimeoutError (a socket's, say): its error
            return _raised(call.name, exc), True
        tool_ctx.cancelled.set()
        return timed_out(call.name, seconds), True
    except asyncio.CancelledError:
        # The turn is being cancelled (request_cancel cancels the task running it).
        tool_ctx.cancelled.set()
        raise
    except ToolError as exc:  # the tool's own refusal, in words meant for the model
        return f"Error: {exc}", True
    except Exception as exc:  # a tool's bug is reported to the model, not raised
        return _raised(call.name, exc), True


def _raised(name: str, exc: Exception) -> str:
    return f"Error: {name} raised {type(exc).__name__}: {exc}"


def timed_out(name: str, seconds: float) -> str:
    """The result the model reads for a call that ran past its timeout."""
    return f"Error: {name} timed out after {seconds:g} seconds; it was told to stop."


def _asked(ctx: TurnContext, call: ToolCall, kind: str, payload: dict[str, object]) -> NewDecision:
    return NewDecision(
        call.id,
        "question" if kind == "question" else "approval",
        {**payload, "agent": ctx.agent.name},  # the agent that asks (after any handoff)
        ctx.agent.approval_timeout,
    )
