"""The last step of a turn that did not answer: close it honestly.

A cancelled, interrupted, failed or limited turn keeps what it streamed as a partial reply
(``complete=False``), and every tool call it committed without a result gets one saying it was
aborted, so calls and results always pair (DESIGN §3).
"""

from __future__ import annotations

from tether.events import MESSAGE_COMPLETED, TOOL_RESULT
from tether.loop.context import TurnContext, TurnResult
from tether.loop.state import TurnState, step_meta
from tether.records import ABORTED_TOOL_RESULT, CancelStatus, NewItem, Reason, TurnEnding


async def closed(
    ctx: TurnContext,
    state: TurnState,
    status: CancelStatus,
    reason: Reason,
    error: str | None = None,
) -> TurnResult:
    await ctx.sink.settle()
    items: list[NewItem] = []
    partial = state.partial_text
    if partial:
        items.append(NewItem("assistant", partial, complete=False, meta=step_meta(ctx, state)))
        ctx.sink.emit(MESSAGE_COMPLETED, {"text": partial, "complete": False})
    for call_id, name in ctx.sink.open_calls():
        items.append(
            NewItem(
                "tool_result",
                ABORTED_TOOL_RESULT,
                call_id=call_id,
                tool_name=name,
                meta=step_meta(ctx, state, error=True),
            )
        )
        ctx.sink.emit(
            TOOL_RESULT,
            {"call_id": call_id, "name": name, "output": ABORTED_TOOL_RESULT, "error": True},
        )
    return TurnResult(TurnEnding(status, reason, partial or None, False, error, state.usage), items)
