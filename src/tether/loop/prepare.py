"""Step 1 of a turn: assemble the prompt.

The prompt is the agent's instructions (with its skills, :attr:`TurnContext.instructions`),
recalled memory as a delimited data block, the summary
of what fell out of the window (if any), the newest history items that fit the context budget
(:mod:`.window`), then this turn's input.
"""

from __future__ import annotations

import asyncio
import logging

from tether.errors import StaleLease
from tether.events import MEMORY_RECALLED
from tether.loop.compact import summarise, summary_tokens
from tether.loop.context import TurnContext
from tether.loop.state import TurnState
from tether.loop.window import Window, estimate_tokens, render, select_window
from tether.memory import prompt
from tether.models.base import Message

log = logging.getLogger("tether.loop")

DEFAULT_OUTPUT_RESERVE = 512


def context_budget(ctx: TurnContext, system: str) -> int:
    agent = ctx.agent
    if agent.context_budget is not None:
        return agent.context_budget
    reserve = agent.max_output_tokens or DEFAULT_OUTPUT_RESERVE
    fixed = estimate_tokens(system) + estimate_tokens(ctx.input)
    fixed += sum(estimate_tokens(str(t.parameters)) for t in ctx.tools)
    return max(0, ctx.model.context_window - reserve - fixed)


async def _recall(ctx: TurnContext, resumed: bool) -> str:
    """The recalled-data block for the system prompt; memory trouble never fails the turn.

    A resumed turn recalls again for its prompt, but its notes were kept (and its recall
    announced) when it started."""
    if ctx.memory is None:
        return ""
    try:
        hits = await ctx.memory.recall(ctx.input)
        if hits and not resumed:
            ctx.sink.emit(MEMORY_RECALLED, prompt.event_data(hits))
        if not resumed:
            # After recall: this message's own notes are in the prompt as the message itself.
            await ctx.memory.keep_notes(ctx.input)
    except (asyncio.CancelledError, StaleLease):
        raise
    except Exception:
        log.warning("turn %s: memory unavailable; going on without it", ctx.turn_id, exc_info=True)
        return ""
    return prompt.block(hits)


def system_message(instructions: str, recalled: str) -> str:
    """The instructions, then the recalled-data block when it goes in the system message."""
    return f"{instructions}\n\n{recalled}" if recalled else instructions


async def prepare(ctx: TurnContext, state: TurnState, *, resumed: bool = False) -> None:
    """The prompt up to this turn's input. A resumed turn gets the same one, and makes no new
    summary (the loop then adds the turn's own steps)."""
    instructions = ctx.instructions
    recalled = await _recall(ctx, resumed)
    # Recalled data goes in the system prompt, after the instructions, as a block of its own;
    # a model that attends to the end of its prompt (the embedded one) gets it as a system
    # message right before the newest user message instead, when history stands in between
    # (see LocalModel).
    near_question = bool(recalled) and getattr(ctx.model, "recall_near_question", False)
    budget = context_budget(ctx, f"{instructions}\n\n{recalled}" if recalled else instructions)
    if not ctx.agent.memory.history:
        # The conversation is kept, but this agent answers each message on its own.
        window = Window([], False)
    else:
        window = await select_window(ctx.history, ctx.input_seq, budget, ctx.memo)
    summary = None
    if window.truncated:
        # Only a conversation that outgrew the window has a summary to place (or to make): the
        # common short one costs no summary read.
        summary = await ctx.history.latest_summary()
        if summary is not None:
            window = await select_window(
                ctx.history, ctx.input_seq, budget - summary_tokens(summary), ctx.memo
            )
        if ctx.agent.memory.summarize and not resumed:
            first_kept = window.items[0].seq if window.items else ctx.input_seq
            fresh = await summarise(ctx, state, summary, first_kept)
            if fresh is not None:
                summary = fresh
                # The new summary may be longer than the old one: re-fit the window under it.
                window = await select_window(
                    ctx.history, ctx.input_seq, budget - summary_tokens(summary), ctx.memo
                )
    late = near_question and bool(window.items)
    state.recalled = recalled if recalled and not late else ""
    system = system_message(instructions, state.recalled)
    # The summary is about what came before the window, so it goes first (its own seq is later).
    state.messages = [
        Message("system", system),
        *render([summary] if summary is not None else []),
        *(window.messages if window.messages is not None else render(window.items, ctx.memo)),
        *([Message("system", recalled)] if late else []),
        Message("user", ctx.input),
    ]
