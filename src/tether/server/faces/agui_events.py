"""tether's turn events restated as AG-UI events (``ag-ui-protocol`` 1.0 models).

One :class:`Translation` per run: it keeps which text message is open, so every
``TEXT_MESSAGE_CONTENT`` sits between its ``TEXT_MESSAGE_START`` and ``TEXT_MESSAGE_END`` with
the same message id, and a tool call closes the text before it. Ids are made from the turn and
the event's ``seq``, so a run that resumes the same turn later never reuses one.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from tether import events
from tether.records import Event, Turn
from tether.server.faces.endings import ended_code, ended_message

AWAITING_INPUT = "tether.awaiting_input"
"""The CUSTOM event sent before an interrupt outcome, for consumers that predate outcomes."""


class Translation:
    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self._open: str | None = None
        self._last_message: str | None = None

    def event(self, event: Event) -> list[BaseEvent]:
        """The AG-UI events one tether event becomes (none for those AG-UI has no word for:
        queueing, memory, ``tool.started``…)."""
        data = event.data
        if event.type == events.MESSAGE_DELTA:
            return self._text(event, str(data.get("text") or ""))
        if event.type == events.MESSAGE_COMPLETED:
            if self._open is None and data.get("text"):
                # A model that did not stream: the whole text at once.
                return [*self._text(event, str(data["text"])), *self.close()]
            return self.close()
        if event.type == events.TOOL_CALL:
            call_id = str(data["call_id"])
            return [
                *self.close(),
                ToolCallStartEvent(
                    tool_call_id=call_id,
                    tool_call_name=str(data["name"]),
                    parent_message_id=self._last_message,
                ),
                ToolCallArgsEvent(tool_call_id=call_id, delta=_json(data.get("arguments"))),
                ToolCallEndEvent(tool_call_id=call_id),
            ]
        if event.type == events.TOOL_RESULT:
            call_id = str(data["call_id"])
            return [
                ToolCallResultEvent(
                    message_id=f"tool_{event.turn_id}_{event.seq}",
                    tool_call_id=call_id,
                    content=str(data.get("output", "")),
                    role="tool",
                )
            ]
        return []

    def _text(self, event: Event, text: str) -> list[BaseEvent]:
        if not text:
            return []
        out: list[BaseEvent] = []
        if self._open is None:
            self._open = self._last_message = f"msg_{event.turn_id}_{event.seq}"
            out.append(TextMessageStartEvent(message_id=self._open, role="assistant"))
        out.append(TextMessageContentEvent(message_id=self._open, delta=text))
        return out

    def close(self) -> list[BaseEvent]:
        if self._open is None:
            return []
        closing, self._open = self._open, None
        return [TextMessageEndEvent(message_id=closing)]

    def ended(self, turn: Turn) -> list[BaseEvent]:
        """The run's last event for a turn that ended: only a completed one finishes it."""
        if turn.status == "completed":
            usage = TokenUsage(
                input_tokens=turn.usage.input_tokens,
                output_tokens=turn.usage.output_tokens,
                total_tokens=turn.usage.input_tokens + turn.usage.output_tokens,
            )
            result = {"turn_id": turn.id, "reply": turn.output or "", "complete": turn.complete}
            finished = RunFinishedEvent(
                thread_id=self.thread_id,
                run_id=self.run_id,
                result=result,
                outcome=RunFinishedSuccessOutcome(),
                usage=[usage],
            )
            return [*self.close(), finished]
        return [*self.close(), RunErrorEvent(message=ended_message(turn), code=ended_code(turn))]

    def interrupted(self, session_id: str, decision: dict[str, Any]) -> list[BaseEvent]:
        """The run's end for a turn waiting for a human: its pending decision (a turn parks on
        one at a time) as an interrupt, announced first as a CUSTOM event too."""
        value = {"session_id": session_id, "turn_id": decision["turn_id"], "decision": decision}
        outcome = RunFinishedInterruptOutcome(interrupts=[interrupt(decision)])
        return [
            *self.close(),
            CustomEvent(name=AWAITING_INPUT, value=value),
            RunFinishedEvent(thread_id=self.thread_id, run_id=self.run_id, outcome=outcome),
        ]


def interrupt(d: dict[str, Any]) -> Interrupt:
    """A pending decision (as events carry it) as an AG-UI interrupt, answered by the decision's
    ``call_id``."""
    payload: dict[str, Any] = d.get("payload") or {}
    call_id = str(d["call_id"])
    if d.get("kind") == "question":
        choices = payload.get("choices")
        answer: dict[str, Any] = {"type": "string"}
        if choices:
            answer["enum"] = list(choices)
        reason, message = "question", str(payload.get("question", ""))
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {"answer": answer},
            "required": ["answer"],
        }
        tool_call_id = None
    else:
        verdicts = ["approve", "deny"] if "steps" in payload else ["approve", "deny", "always"]
        schema = {
            "type": "object",
            "properties": {"decision": {"enum": verdicts}},
            "required": ["decision"],
        }
        if "steps" in payload:
            reason = "continue_past_limit"
            message = f"Go on for {payload['steps']} more steps?"
            tool_call_id = None
        else:
            reason = "tool_approval"
            args = _json(payload.get("arguments"))
            message = f"Run {payload.get('tool')} with {args}?"
            tool_call_id = call_id
    return Interrupt(
        id=call_id,
        reason=reason,
        message=message,
        tool_call_id=tool_call_id,
        response_schema=schema,
        expires_at=datetime.fromtimestamp(float(d["deadline"]), UTC).isoformat(),
        metadata={"tether": {"turn_id": d.get("turn_id"), "kind": d.get("kind")}},
    )


def _json(arguments: object) -> str:
    """A call's arguments as JSON text (events carry the model's text, or an object)."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
