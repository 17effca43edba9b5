"""The mutable state of one running turn, private to it.

It is what a cancellation looks at to end the turn honestly: the reply streamed so far and the
tool calls that have no result yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tether.models.base import Message, ToolCall
from tether.records import Usage

if TYPE_CHECKING:
    from tether.loop.context import TurnContext

LOOP_REPEATS = 3


@dataclass
class TurnState:
    messages: list[Message] = field(default_factory=list)
    """This turn's prompt so far: instructions, history window, input and the turn's own steps."""
    partial_text: str = ""
    """Text streamed in the current model step and not yet committed."""
    step: int = 0
    limit: int = 0
    """Steps this turn may take: ``max_iterations``, plus what a human allowed past it."""
    usage: Usage = field(default_factory=Usage)
    recent_calls: list[tuple[str, str]] = field(default_factory=list)
    last_text: str = ""
    recalled: str = ""
    """The recalled-data block the system message carries after the instructions ("" when
    there is none, or it sits near the question instead): kept through a handoff."""
    handoffs: int = 0
    """Transfers this turn made so far."""
    agent_from_step: int = 0
    """The step after which the running agent took over (0: it started the turn)."""

    def add_usage(self, input_tokens: int, output_tokens: int) -> None:
        u = self.usage
        self.usage = Usage(
            u.input_tokens + input_tokens, u.output_tokens + output_tokens, u.model_calls + 1
        )

    def is_loop(self, call: ToolCall) -> bool:
        """Record ``call``; true when it is the third identical call in a row."""
        try:
            canonical = json.dumps(json.loads(call.arguments or "{}"), sort_keys=True)
        except ValueError:
            canonical = call.arguments
        sig = (call.name, canonical)
        if self.recent_calls and self.recent_calls[-1] != sig:
            self.recent_calls.clear()
        self.recent_calls.append(sig)
        return len(self.recent_calls) >= LOOP_REPEATS


def step_meta(ctx: TurnContext, state: TurnState, **more: Any) -> dict[str, Any]:
    """The ``meta`` of an item a step writes: its step and the agent that ran it (a session
    may be served by several agents, and a handoff changes the agent within a turn)."""
    return {"step": state.step, "agent": ctx.agent.name, **more}
