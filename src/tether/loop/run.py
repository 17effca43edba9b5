"""The turn loop: prepare → (model step → tools)* → resolve, ending in exactly one outcome.

Cancellation is the one control signal that crosses steps. The scheduler cancels the task
running :func:`drive`; :func:`run_turn` then closes the turn honestly from :class:`TurnState`:
the partial reply is kept with ``complete=False`` and every open tool call gets a result.
"""

from __future__ import annotations

import asyncio
import logging

from tether.errors import ModelError, StaleLease
from tether.loop.compact import summarise, summary_tokens
from tether.loop.context import TurnContext, TurnResult
from tether.loop.model_step import model_step
from tether.loop.prepare import estimate_tokens, render, select_window
from tether.loop.state import TurnState
from tether.loop.tools_step import run_call
from tether.memory import recall
from tether.models.base import Message
from tether.records import ABORTED_TOOL_RESULT, CancelStatus, NewItem, Reason, TurnEnding

log = logging.getLogger("tether.loop")

DEFAULT_OUTPUT_RESERVE = 512
LOOP_RESULT = "Tool call not executed: the same call was repeated three times in a row."


def context_budget(ctx: TurnContext, system: str) -> int:
    agent = ctx.agent
    if agent.context_budget is not None:
        return agent.context_budget
    reserve = agent.max_output_tokens or DEFAULT_OUTPUT_RESERVE
    fixed = estimate_tokens(system) + estimate_tokens(ctx.input)
    fixed += sum(estimate_tokens(str(t.parameters)) for t in ctx.tools)
    return max(0, ctx.model.context_window - reserve - fixed)


async def _recall(ctx: TurnContext) -> str:
    """The recalled-data block for the system prompt; memory trouble never fails the turn."""
    if ctx.memory is None:
        return ""
    try:
        hits = await ctx.memory.recall(ctx.input)
        if hits:
            ctx.sink.emit("memory.recalled", recall.event_data(hits))
        # After recall: this message's own notes are in the prompt as the message itself.
        await ctx.memory.keep_notes(ctx.input)
    except (asyncio.CancelledError, StaleLease):
        raise
    except Exception:
        log.warning("turn %s: memory unavailable; going on without it", ctx.turn_id, exc_info=True)
        return ""
    return recall.block(hits)


async def prepare(ctx: TurnContext, state: TurnState) -> None:
    instructions = ctx.agent.instructions
    recalled = await _recall(ctx)
    # Recalled data goes in the system prompt, after the instructions, as a block of its own;
    # a model that attends to the end of its prompt (the embedded one) gets it as a system
    # message right before the newest user message instead, when history stands in between
    # (see LocalModel).
    near_question = bool(recalled) and getattr(ctx.model, "recall_near_question", False)
    budget = context_budget(ctx, f"{instructions}\n\n{recalled}" if recalled else instructions)
    window = await select_window(ctx.history, ctx.input_seq, budget)
    summary = None
    if window.truncated:
        # Only a conversation that outgrew the window has a summary to place (or to make): the
        # common short one costs no summary read.
        summary = await ctx.history.latest_summary()
        if summary is not None:
            window = await select_window(
                ctx.history, ctx.input_seq, budget - summary_tokens(summary)
            )
        if ctx.agent.memory.summarize:
            first_kept = window.items[0].seq if window.items else ctx.input_seq
            fresh = await summarise(ctx, state, summary, first_kept)
            if fresh is not None:
                summary = fresh
                # The new summary may be longer than the old one: re-fit the window under it.
                window = await select_window(
                    ctx.history, ctx.input_seq, budget - summary_tokens(summary)
                )
    late = near_question and bool(window.items)
    system = f"{instructions}\n\n{recalled}" if recalled and not late else instructions
    # The summary is about what came before the window, so it goes first (its own seq is later).
    state.messages = [
        Message("system", system),
        *render([summary] if summary is not None else []),
        *render(window.items),
        *([Message("system", recalled)] if late else []),
        Message("user", ctx.input),
    ]


async def drive(ctx: TurnContext, state: TurnState) -> TurnResult:
    await prepare(ctx, state)
    agent = ctx.agent
    specs = tuple(t.spec for t in ctx.tools)
    for _ in range(agent.max_iterations):
        state.step += 1
        out = await model_step(ctx, state, specs)
        if not out.calls:
            state.partial_text = ""
            ctx.sink.emit("message.completed", {"text": out.text, "complete": True})
            item = NewItem("assistant", out.text, meta={"step": state.step})
            return TurnResult(
                TurnEnding("completed", "answered", out.text, True, usage=state.usage), [item]
            )
        # The calls are made durable before any tool runs, so a crash mid-tool leaves a call
        # that recovery can pair with an "aborted" result.
        items: list[NewItem] = []
        if out.text:
            ctx.sink.emit("message.completed", {"text": out.text, "complete": True})
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
                "tool.call", {"call_id": call.id, "name": call.name, "arguments": call.arguments}
            )
        state.partial_text = ""
        await ctx.sink.commit(items)
        state.messages.append(Message("assistant", out.text, tuple(out.calls)))

        looped = False
        results: list[NewItem] = []
        for call in out.calls:
            if state.is_loop(call):
                looped = True
                text, is_error = LOOP_RESULT, True
            else:
                text, is_error = await run_call(ctx, call)
            ctx.sink.emit(
                "tool.result",
                {"call_id": call.id, "name": call.name, "output": text, "error": is_error},
            )
            results.append(
                NewItem(
                    "tool_result",
                    text,
                    call_id=call.id,
                    tool_name=call.name,
                    meta={"step": state.step, "error": is_error},
                )
            )
            state.messages.append(Message("tool", text, tool_call_id=call.id))
            if looped:
                break
        if looped:
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
    return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])


async def run_turn(ctx: TurnContext) -> TurnResult:
    """Run the turn to exactly one ending. Raises only StaleLease (the turn is no longer ours).

    Cancellation arrives through :meth:`TurnContext.request_cancel`, which cancels the task
    running :func:`drive`; this function is not cancelled itself and closes the turn.
    """
    state = TurnState()
    if ctx.cancelled.is_set():
        return await _closed(ctx, state, ctx.cancel_status, ctx.cancel_reason)
    body = asyncio.create_task(drive(ctx, state))
    ctx._body = body
    try:
        return await body
    except asyncio.CancelledError:
        if not ctx.cancelled.is_set():
            raise  # we are being torn down from outside, not asked to cancel the turn
        return await _closed(ctx, state, ctx.cancel_status, ctx.cancel_reason)
    except StaleLease:
        raise
    except ModelError as exc:
        log.warning("turn %s: model failed: %s", ctx.turn_id, exc)
        return await _closed(ctx, state, "failed", "model_error", error=str(exc))
    except Exception as exc:
        log.exception("turn %s: internal error", ctx.turn_id)
        return await _closed(ctx, state, "failed", "internal_error", error=type(exc).__name__)
    finally:
        ctx._body = None


async def _closed(
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
        items.append(NewItem("assistant", partial, complete=False, meta={"step": state.step}))
        ctx.sink.emit("message.completed", {"text": partial, "complete": False})
    for call_id, name in ctx.sink.open_calls():
        items.append(
            NewItem(
                "tool_result",
                ABORTED_TOOL_RESULT,
                call_id=call_id,
                tool_name=name,
                meta={"step": state.step, "error": True},
            )
        )
        ctx.sink.emit(
            "tool.result",
            {"call_id": call_id, "name": name, "output": ABORTED_TOOL_RESULT, "error": True},
        )
    return TurnResult(TurnEnding(status, reason, partial or None, False, error, state.usage), items)
