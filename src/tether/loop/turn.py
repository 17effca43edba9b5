"""The turn loop: prepare → (model step → tools)* → resolve, ending in exactly one outcome.

Cancellation is the one control signal that crosses steps. The scheduler cancels the task
running :func:`drive`; :func:`run_turn` then closes the turn honestly from :class:`TurnState`:
the partial reply is kept with ``complete=False`` and every open tool call gets a result.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from tether.errors import ModelError, StaleLease
from tether.events import MESSAGE_COMPLETED, TOOL_CALL, TOOL_RESULT
from tether.loop.context import TurnContext, TurnResult
from tether.loop.model_step import model_step
from tether.loop.prepare import prepare
from tether.loop.resolve import closed
from tether.loop.state import TurnState
from tether.loop.tools_step import run_calls
from tether.models.base import Message, ToolCall
from tether.records import NewItem, TurnEnding

log = logging.getLogger("tether.loop")

LOOP_RESULT = "Tool call not executed: the same call was repeated three times in a row."
FINISH_NOTE = (
    "You have used every step this turn allows. Do not call tools; answer the user now with"
    " what you have found so far, and say what is left undone."
)


async def drive(ctx: TurnContext, state: TurnState) -> TurnResult:
    await prepare(ctx, state)
    agent = ctx.agent
    specs = tuple(t.spec for t in ctx.tools)
    for _ in range(agent.max_iterations):
        state.step += 1
        out = await model_step(ctx, state, specs)
        if not out.calls:
            state.partial_text = ""
            ctx.sink.emit(MESSAGE_COMPLETED, {"text": out.text, "complete": True})
            item = NewItem("assistant", out.text, meta={"step": state.step})
            return TurnResult(
                TurnEnding("completed", "answered", out.text, True, usage=state.usage), [item]
            )
        # The calls are made durable before any tool runs, so a crash mid-tool leaves a call
        # that recovery can pair with an "aborted" result.
        items: list[NewItem] = []
        if out.text:
            ctx.sink.emit(MESSAGE_COMPLETED, {"text": out.text, "complete": True})
            items.append(NewItem("assistant", out.text, meta={"step": state.step}))
        for call in out.calls:
            items.append(
                NewItem(
                    "tool_call",
                    "",
                    call_id=call.id,
                    tool_name=call.name,
                    arguments=call.arguments,
                    meta={"step": state.step},
                )
            )
            ctx.sink.emit(
                TOOL_CALL, {"call_id": call.id, "name": call.name, "arguments": call.arguments}
            )
        state.partial_text = ""
        await ctx.sink.commit(items)
        state.messages.append(Message("assistant", out.text, tuple(out.calls)))

        # The calls that run: those before the first one repeated a third time in a row.
        runnable = list(itertools.takewhile(lambda c: not state.is_loop(c), out.calls))
        looped = len(runnable) < len(out.calls)
        results: list[NewItem] = []
        async for call, text, is_error in run_calls(ctx, runnable):
            results.append(_result(ctx, state, call, text, is_error))
        if looped:
            results.append(_result(ctx, state, out.calls[len(runnable)], LOOP_RESULT, True))
            # The remaining calls of this step never ran; each still needs its result.
            answered = {r.call_id for r in results}
            for call in out.calls:
                if call.id not in answered:
                    results.append(
                        NewItem(
                            "tool_result",
                            LOOP_RESULT,
                            call_id=call.id,
                            tool_name=call.name,
                            meta={"step": state.step},
                        )
                    )
            return TurnResult(TurnEnding("limit_reached", "loop", usage=state.usage), results)
        await ctx.sink.commit(results)
        used = state.usage.input_tokens + state.usage.output_tokens
        if agent.token_budget is not None and used >= agent.token_budget:
            return TurnResult(TurnEnding("limit_reached", "token_budget", usage=state.usage), [])
    if agent.on_max_iterations == "finish":
        return await _finish(ctx, state)
    return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])


async def _finish(ctx: TurnContext, state: TurnState) -> TurnResult:
    """One last model call, offered no tools, told to answer with what it has: the turn then
    ends ``completed`` but says how (``finished_at_limit``), so the outcome stays honest."""
    state.step += 1
    state.messages.append(Message("system", FINISH_NOTE))
    out = await model_step(ctx, state, ())
    if out.calls:
        # Asked for a tool it was not offered: nothing runs, and no answer came.
        return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])
    state.partial_text = ""
    ctx.sink.emit(MESSAGE_COMPLETED, {"text": out.text, "complete": True})
    item = NewItem("assistant", out.text, meta={"step": state.step})
    ending = TurnEnding("completed", "finished_at_limit", out.text, True, usage=state.usage)
    return TurnResult(ending, [item])


def _result(ctx: TurnContext, state: TurnState, call: ToolCall, text: str, error: bool) -> NewItem:
    """Announce a call's result, add it to the prompt, and return the item that stores it."""
    ctx.sink.emit(
        TOOL_RESULT, {"call_id": call.id, "name": call.name, "output": text, "error": error}
    )
    state.messages.append(Message("tool", text, tool_call_id=call.id))
    return NewItem(
        "tool_result",
        text,
        call_id=call.id,
        tool_name=call.name,
        meta={"step": state.step, "error": error},
    )


async def run_turn(ctx: TurnContext) -> TurnResult:
    """Run the turn to exactly one ending. Raises only StaleLease (the turn is no longer ours).

    Cancellation arrives through :meth:`TurnContext.request_cancel`, which cancels the task
    running :func:`drive`; this function is not cancelled itself and closes the turn.
    """
    state = TurnState()
    if ctx.cancelled.is_set():
        return await closed(ctx, state, ctx.cancel_status, ctx.cancel_reason)
    body = asyncio.create_task(drive(ctx, state))
    ctx._body = body
    try:
        return await body
    except asyncio.CancelledError:
        if not ctx.cancelled.is_set():
            raise  # we are being torn down from outside, not asked to cancel the turn
        return await closed(ctx, state, ctx.cancel_status, ctx.cancel_reason)
    except StaleLease:
        raise
    except ModelError as exc:
        log.warning("turn %s: model failed: %s", ctx.turn_id, exc)
        return await closed(ctx, state, "failed", "model_error", error=str(exc))
    except Exception as exc:
        log.exception("turn %s: internal error", ctx.turn_id)
        return await closed(ctx, state, "failed", "internal_error", error=type(exc).__name__)
    finally:
        ctx._body = None
