"""Step 2 of a turn: one model call, streamed, with bounded retries of transient errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from tether.errors import ModelError
from tether.events import MESSAGE_DELTA
from tether.loop.context import TurnContext
from tether.loop.state import TurnState
from tether.models.base import (
    Finish,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from tether.records import new_call_id


@dataclass(frozen=True, slots=True)
class StepOutput:
    text: str
    calls: list[ToolCall]
    finish: str


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ModelError) and exc.transient


async def model_step(ctx: TurnContext, state: TurnState, tools: tuple[ToolSpec, ...]) -> StepOutput:
    request = ModelRequest(
        messages=tuple(state.messages),
        tools=tools,
        max_output_tokens=ctx.agent.max_output_tokens,
        temperature=ctx.agent.temperature,
    )
    try:
        return await _stream_once(ctx, state, request)
    except ModelError as exc:
        if not exc.transient or ctx.agent.retry.attempts <= 1:
            raise
    # The first attempt failed transiently: the remaining attempts go through tenacity (built
    # only now, so the common path pays nothing for it).
    policy = ctx.agent.retry
    await asyncio.sleep(policy.initial_backoff)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts - 1),
        wait=wait_exponential_jitter(multiplier=policy.initial_backoff, max=policy.max_backoff),
        retry=retry_if_exception(_retryable),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            return await _stream_once(ctx, state, request)
    raise AssertionError("unreachable: tenacity reraises the last error")


async def _stream_once(ctx: TurnContext, state: TurnState, request: ModelRequest) -> StepOutput:
    state.partial_text = ""
    parts: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish = "stop"
    usage = Usage()
    try:
        async for event in ctx.model.stream(request):
            if isinstance(event, TextDelta):
                if event.text:
                    parts.append(event.text)
                    state.partial_text += event.text
                    ctx.sink.emit(MESSAGE_DELTA, {"text": event.text})
            elif isinstance(event, ToolCallDelta):
                slot = calls.setdefault(event.index, {"name": "", "arguments": ""})
                if event.name:
                    slot["name"] += event.name
                slot["arguments"] += event.arguments
            elif isinstance(event, Usage):
                usage = event
            elif isinstance(event, Finish):
                finish = event.reason
    except ModelError as exc:
        if parts and exc.transient:
            # Text already reached clients; a silent retry would show them two answers.
            raise ModelError(f"{exc} (after partial output)", status=exc.status) from exc
        raise
    except asyncio.CancelledError:
        # Cut short (cancel, interrupt, rollback): the call was made all the same. Its tokens
        # are what the provider said so far, usually nothing: a stream reports them last.
        state.add_usage(usage.input_tokens, usage.output_tokens)
        raise
    state.add_usage(usage.input_tokens, usage.output_tokens)
    # tether mints its own call ids: providers reuse theirs ("call_0" every step), and pairing
    # calls with results across a whole session needs ids that are unique in it.
    tool_calls = [
        ToolCall(new_call_id(), c["name"], c["arguments"] or "{}") for _, c in sorted(calls.items())
    ]
    return StepOutput("".join(parts), tool_calls, finish)
