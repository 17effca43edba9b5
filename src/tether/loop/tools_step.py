"""Step 3 of a turn: run the tool calls the model asked for.

A tool's failure is the model's business, not the turn's: errors, timeouts, unknown tools,
invalid arguments and refusals all become a tool result the model reads.

Calls run in the order the model made them, except that consecutive calls of ``read_only``
tools run together: they change nothing, so no order among them can be observed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from tether.errors import InvalidInput
from tether.events import DECISION_REQUESTED as TOOL_APPROVAL_REQUESTED
from tether.loop.context import TurnContext
from tether.models.base import ToolCall
from tether.tools.approval import REFUSED_RESULT, ApprovalRequest
from tether.tools.context import ToolContext


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
        shareable = tool is not None and tool.read_only and not tool.requires_approval
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
        names = ", ".join(t.name for t in ctx.tools) or "none"
        return f"Error: there is no tool named {call.name!r} (available: {names}).", True
    try:
        tool.parse_arguments(call.arguments)
    except InvalidInput as exc:
        return f"Error: {exc}", True
    if tool.requires_approval and not await _approved(ctx, call):
        return REFUSED_RESULT, True
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
        memory=ctx.memory,
    )
    timeout = tool.timeout if tool.timeout is not None else ctx.agent.tool_timeout
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await tool.invoke(call.arguments, tool_ctx), False
    except TimeoutError as exc:
        if not deadline.expired():  # the tool's own TimeoutError (a socket's, say): its error
            return _raised(call.name, exc), True
        stop.set()
        return timed_out(call.name, timeout), True
    except asyncio.CancelledError:
        stop.set()  # the turn is being cancelled (request_cancel cancels the task running it)
        raise
    except Exception as exc:  # a tool's bug is reported to the model, not raised
        return _raised(call.name, exc), True


def _raised(name: str, exc: Exception) -> str:
    return f"Error: {name} raised {type(exc).__name__}: {exc}"


def timed_out(name: str, seconds: float) -> str:
    """The result the model reads for a call that ran past its timeout."""
    return f"Error: {name} timed out after {seconds:g} seconds; it was told to stop."


async def _approved(ctx: TurnContext, call: ToolCall) -> bool:
    ctx.sink.emit(
        TOOL_APPROVAL_REQUESTED,
        {"call_id": call.id, "name": call.name, "arguments": call.arguments},
    )
    if ctx.approver is None:
        return False
    request = ApprovalRequest(ctx.key, ctx.turn_id, call.id, call.name, call.arguments)
    try:
        async with asyncio.timeout(ctx.agent.approval_timeout):
            return (await ctx.approver(request)) is True
    except asyncio.CancelledError:
        raise
    except Exception:  # an approver that errs or times out refuses: fail closed
        return False
