"""The turn loop: prepare → (model step → tools)* → resolve, ending in exactly one outcome.

Cancellation is the one control signal that crosses steps. The scheduler cancels the task
running :func:`drive`; :func:`run_turn` then closes the turn honestly from :class:`TurnState`:
the partial reply is kept with ``complete=False`` and every open tool call gets a result.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging

from tether.errors import ConfigError, ModelError, StaleLease, internal_error_message
from tether.events import HANDOFF, MESSAGE_COMPLETED, TOOL_CALL, TOOL_RESULT
from tether.handoff import MAX_HANDOFFS_PER_TURN
from tether.loop.context import Resumed, Switch, TurnContext, TurnPark, TurnResult
from tether.loop.model_step import model_step
from tether.loop.prepare import prepare, system_message
from tether.loop.resolve import closed
from tether.loop.state import TurnState, step_meta
from tether.loop.tools_step import NeedsDecision, run_calls
from tether.loop.window import render
from tether.models.base import Message, ToolCall
from tether.records import NewDecision, NewItem, Reason, TurnEnding

log = logging.getLogger("tether.loop")

LIMIT_CALL_PREFIX = "limit-"
"""Call id of an iteration-limit decision (``limit-<step>``): it is about no tool call."""
LOOP_RESULT = "Tool call not executed: the same call was repeated three times in a row."
NOT_RUN_AFTER_TRANSFER = (
    "Tool call not executed: the conversation was transferred to another agent before it."
)
FINISH_NOTE = (
    "You have used every step this turn allows. Do not call tools; answer the user now with"
    " what you have found so far, and say what is left undone."
)


async def drive(ctx: TurnContext, state: TurnState) -> TurnResult | TurnPark:
    resumed = ctx.resumed
    await prepare(ctx, state, resumed=resumed is not None)
    agent = ctx.agent
    state.limit = agent.max_iterations
    if resumed is not None:
        outcome = await _go_on(ctx, state, resumed)
        if outcome is not None:
            return outcome
    while True:
        while state.step < state.limit:
            state.step += 1
            _skills_in_prompt(ctx, state)
            # Asked each step: a handoff changes the agent, and with it what is offered.
            out = await model_step(ctx, state, ctx.specs())
            if not out.calls:
                return _answered(ctx, state, out.text, out.finish, "answered")
            # The calls are made durable before any tool runs, so a crash mid-tool leaves a
            # call that recovery can pair with an "aborted" result.
            items: list[NewItem] = []
            if out.text:
                ctx.sink.emit(MESSAGE_COMPLETED, {"text": out.text, "complete": True})
                items.append(NewItem("assistant", out.text, meta=step_meta(ctx, state)))
            for call in out.calls:
                items.append(
                    NewItem(
                        "tool_call",
                        "",
                        call_id=call.id,
                        tool_name=call.name,
                        arguments=call.arguments,
                        meta=step_meta(ctx, state),
                    )
                )
                ctx.sink.emit(
                    TOOL_CALL, {"call_id": call.id, "name": call.name, "arguments": call.arguments}
                )
            state.partial_text = ""
            await ctx.sink.commit(items)
            state.messages.append(Message("assistant", out.text, tuple(out.calls)))
            outcome = await _run_step(ctx, state, list(out.calls))
            if outcome is not None:
                return outcome
        outcome = await _at_limit(ctx, state)
        if outcome is not None:
            return outcome


async def _run_step(
    ctx: TurnContext, state: TurnState, calls: list[ToolCall]
) -> TurnResult | TurnPark | None:
    """Run a step's calls (or, resumed, those still without a result); None to go on."""
    # The calls that run: those before the first one repeated a third time in a row.
    runnable = list(itertools.takewhile(lambda c: not state.is_loop(c), calls))
    looped = len(runnable) < len(calls)
    # A transfer ends the step: the calls the model made before it run, those after it do not
    # (the conversation is the other agent's by then, and they are this agent's tools).
    transfer = next((n for n, c in enumerate(runnable) if ctx.agent.handoff_named(c.name)), None)
    if transfer is not None:
        runnable, looped = runnable[: transfer + 1], False
    results: list[NewItem] = []
    try:
        async for call, text, is_error in run_calls(ctx, runnable[:transfer]):
            results.append(_result(ctx, state, call, text, is_error))
    except NeedsDecision as asked:
        # The calls after this one wait with it: they run, in order, once it is decided.
        return TurnPark(asked.decision, results, state.usage)
    if transfer is not None:
        switch = _transfer(ctx, state, runnable[transfer], results)
        for call in calls[transfer + 1 :]:
            results.append(_result(ctx, state, call, NOT_RUN_AFTER_TRANSFER, True))
        await ctx.sink.commit(results)
        if switch is not None:
            _take_over(ctx, state, switch)
        return _over_budget(ctx, state)
    if looped:
        results.append(_result(ctx, state, calls[len(runnable)], LOOP_RESULT, True))
        # The remaining calls of this step never ran; each still needs its result.
        answered = {r.call_id for r in results}
        for call in calls:
            if call.id not in answered:
                results.append(
                    NewItem(
                        "tool_result",
                        LOOP_RESULT,
                        call_id=call.id,
                        tool_name=call.name,
                        meta=step_meta(ctx, state),
                    )
                )
        return TurnResult(TurnEnding("limit_reached", "loop", usage=state.usage), results)
    await ctx.sink.commit(results)
    return _over_budget(ctx, state)


def _over_budget(ctx: TurnContext, state: TurnState) -> TurnResult | None:
    used = state.usage.input_tokens + state.usage.output_tokens
    if ctx.agent.token_budget is not None and used >= ctx.agent.token_budget:
        return TurnResult(TurnEnding("limit_reached", "token_budget", usage=state.usage), [])
    return None


def _transfer(
    ctx: TurnContext, state: TurnState, call: ToolCall, results: list[NewItem]
) -> Switch | None:
    """Answer a transfer call (its result, and on success the ``handoff`` item and event);
    returns what the rest of the turn runs, or None when the transfer is refused."""
    target = ctx.agent.handoff_named(call.name)
    assert target is not None
    if state.handoffs >= MAX_HANDOFFS_PER_TURN:
        refused = (
            f"Error: the conversation was already transferred {state.handoffs} times this"
            " turn; answer the user now."
        )
        results.append(_result(ctx, state, call, refused, True))
        return None
    switch = ctx.hand_to(target)
    if switch is None:
        missing = (
            f"Error: the {target.agent_name} agent is not available; answer the user yourself."
        )
        results.append(_result(ctx, state, call, missing, True))
        return None
    results.append(_result(ctx, state, call, target.result(), False))
    data = {
        "from": ctx.agent.name,
        "to": switch.agent.name,
        "call_id": call.id,
        "reason": _reason(call.arguments),
    }
    ctx.sink.emit(HANDOFF, data)
    meta = step_meta(ctx, state, to=switch.agent.name, call_id=call.id, reason=data["reason"])
    results.append(NewItem("handoff", switch.agent.name, call_id=call.id, meta=meta))
    return switch


def _skills_in_prompt(ctx: TurnContext, state: TurnState) -> None:
    """Rebuild the system message of an agent with skills: one activated in the step before
    is in the prompt of the next (the active set is the session's, :attr:`TurnContext.skills`)."""
    if ctx.agent.skills:
        state.messages[0] = Message("system", system_message(ctx.instructions, state.recalled))


def _take_over(ctx: TurnContext, state: TurnState, switch: Switch) -> None:
    """The handed-to agent runs the rest of the turn: its instructions head the prompt (the
    conversation and the recalled data stay), with its own tools, model and step limit."""
    ctx.switch(switch)
    state.handoffs += 1
    state.messages[0] = Message("system", system_message(ctx.instructions, state.recalled))
    state.agent_from_step = state.step
    state.limit = state.step + switch.agent.max_iterations


def _reason(arguments: str) -> str:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return ""
    reason = parsed.get("reason") if isinstance(parsed, dict) else None
    return reason if isinstance(reason, str) else ""


async def _at_limit(ctx: TurnContext, state: TurnState) -> TurnResult | TurnPark | None:
    """The agent used its steps: stop, finish with what it has, or ask to go on (None: the
    limit was raised in-process, go on)."""
    agent = ctx.agent
    if agent.on_max_iterations == "finish":
        return await _finish(ctx, state)
    if agent.on_max_iterations == "ask":
        more = min(
            agent.max_iterations, agent.total_iterations - (state.step - state.agent_from_step)
        )
        if more <= 0:
            ending = TurnEnding("limit_reached", "max_total_iterations", usage=state.usage)
            return TurnResult(ending, [])
        question = (
            f"The agent has used {state.step} steps on this turn. Continue for up to {more} more?"
        )
        payload = {
            "question": question,
            "steps": more,
            "limit": "max_iterations",
            "agent": agent.name,
        }
        asked = NewDecision(
            f"{LIMIT_CALL_PREFIX}{state.step}", "approval", payload, agent.approval_timeout
        )
        return TurnPark(asked, [], state.usage)
    return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])


async def _go_on(
    ctx: TurnContext, state: TurnState, resumed: Resumed
) -> TurnResult | TurnPark | None:
    """Pick a parked turn up where it stopped: its prompt gets the turn's own steps back, then
    the calls still without a result run (the decided one first), or the iteration-limit
    decision is applied. None: go on with the next model step."""
    own = [i for i in resumed.items if i.kind != "user"]
    state.messages.extend(render(own))
    state.usage = resumed.usage
    state.step = max((int(i.meta.get("step", 0)) for i in own), default=0)
    # A handoff earlier in the turn: the agent running now (the scheduler resolved it from the
    # handoff item) took over at that step, and its step limit counts from there.
    handed = [i for i in own if i.kind == "handoff"]
    state.handoffs = len(handed)
    state.agent_from_step = int(handed[-1].meta.get("step", 0)) if handed else 0
    state.limit = state.agent_from_step + ctx.agent.max_iterations
    # Steps the human allowed past the limit, at each time it was reached (by this agent).
    for d in resumed.decisions.values():
        at_limit = d.call_id.startswith(LIMIT_CALL_PREFIX) and d.status == "approved"
        if at_limit and int(d.call_id[len(LIMIT_CALL_PREFIX) :]) > state.agent_from_step:
            state.limit += int(d.payload.get("steps", 0))
    answered = {i.call_id for i in own if i.kind == "tool_result"}
    calls = [
        ToolCall(i.call_id or "", i.tool_name or "", i.arguments or "{}")
        for i in own
        if i.kind == "tool_call"
    ]
    for call in calls:  # the loop check sees the calls in the order they were made
        if call.id in answered:
            state.is_loop(call)
    pending = [c for c in calls if c.id not in answered]
    if pending:
        return await _run_step(ctx, state, pending)
    if state.step >= state.limit:
        # Parked at the limit, and the human said no (or nobody said anything in time).
        return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])
    return None


async def _finish(ctx: TurnContext, state: TurnState) -> TurnResult:
    """One last model call, offered no tools, told to answer with what it has: the turn then
    ends ``completed`` but says how (``finished_at_limit``), so the outcome stays honest."""
    state.step += 1
    _skills_in_prompt(ctx, state)
    state.messages.append(Message("system", FINISH_NOTE))
    out = await model_step(ctx, state, ())
    if out.calls:
        # Asked for a tool it was not offered: nothing runs, and no answer came.
        return TurnResult(TurnEnding("limit_reached", "max_iterations", usage=state.usage), [])
    return _answered(ctx, state, out.text, out.finish, "finished_at_limit")


def _answered(
    ctx: TurnContext, state: TurnState, text: str, finish: str, reason: Reason
) -> TurnResult:
    """The turn's answer. A reply the model stopped at its output cap (finish ``length``) is
    kept, flagged incomplete, and the turn says so (reason ``max_output_tokens``)."""
    state.partial_text = ""
    complete = finish != "length"
    ctx.sink.emit(MESSAGE_COMPLETED, {"text": text, "complete": complete})
    item = NewItem("assistant", text, complete=complete, meta=step_meta(ctx, state))
    why: Reason = reason if complete else "max_output_tokens"
    return TurnResult(TurnEnding("completed", why, text, complete, usage=state.usage), [item])


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
        meta=step_meta(ctx, state, error=error),
    )


async def run_turn(ctx: TurnContext) -> TurnResult | TurnPark:
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
    except ConfigError as exc:
        # The model cannot run as configured (weights not installed, say): the caller reads
        # what to do, as the log does.
        log.warning("turn %s: the model cannot run: %s", ctx.turn_id, exc)
        return await closed(ctx, state, "failed", "model_error", error=str(exc))
    except Exception as exc:
        log.exception("turn %s: internal error", ctx.turn_id)
        return await closed(
            ctx, state, "failed", "internal_error", error=internal_error_message(exc)
        )
    finally:
        ctx._body = None
