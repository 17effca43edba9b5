"""Every event type a turn emits, in one place (DESIGN §9).

A turn's events are persisted with a per-turn ``seq`` and streamed as SSE frames whose
``event:`` line is one of these. Emit and compare through the constants, never through string
literals spread over the code, so the list below stays the whole vocabulary.
"""

from __future__ import annotations

from typing import Final, Literal

EventType = Literal[
    "turn.queued",
    "turn.started",
    "message.delta",
    "message.completed",
    "tool.call",
    "tool.started",
    "tool.result",
    "decision.requested",
    "decision.made",
    "turn.awaiting_input",
    "turn.resumed",
    "memory.recalled",
    "memory.written",
    "context.compacted",
    "handoff",
    "turn.ended",
]

TURN_QUEUED: Final = "turn.queued"
"""The turn was accepted; ``data.seq`` is its place in the session's order. Always seq 1."""
TURN_STARTED: Final = "turn.started"
"""A process took the session's lease and began the turn."""
MESSAGE_DELTA: Final = "message.delta"
"""A piece of streamed assistant text (``data.text``)."""
MESSAGE_COMPLETED: Final = "message.completed"
"""A model step's whole text; ``data.complete`` is False for a partial reply."""
TOOL_CALL: Final = "tool.call"
TOOL_STARTED: Final = "tool.started"
"""An approved tool is about to run (written before it runs: a crash mid-tool then ends the
call aborted, never runs it twice)."""
TOOL_RESULT: Final = "tool.result"
DECISION_REQUESTED: Final = "decision.requested"
"""The turn asks a human: the Decision (``call_id``, ``kind``, ``payload``, ``deadline``)."""
DECISION_MADE: Final = "decision.made"
"""A decision ended: ``status`` (approved, denied, always, answered, expired), ``answer``, who."""
TURN_AWAITING_INPUT: Final = "turn.awaiting_input"
"""The turn parked until its decision is made: it holds no lease and no worker meanwhile."""
TURN_RESUMED: Final = "turn.resumed"
"""A process took the session again and goes on with the turn after its decision."""
MEMORY_RECALLED: Final = "memory.recalled"
"""Ids, scopes and provenance of what recall placed in the prompt (never the text)."""
MEMORY_WRITTEN: Final = "memory.written"
"""A memory item the turn kept (an automatic note, or the model's ``remember``): its id, scope,
kind, author and text. Emitted with the ending that commits it, so never for a note dropped
with a failed or rolled-back turn."""
CONTEXT_COMPACTED: Final = "context.compacted"
HANDOFF: Final = "handoff"
"""The conversation passed to another agent (``from``, ``to``, ``call_id``, ``reason``): the rest
of the turn, and the session's following turns, run ``to``."""
TURN_ENDED: Final = "turn.ended"
"""Terminal, exactly once per turn, with ``status`` and ``reason``."""

EVENT_TYPES: Final[tuple[EventType, ...]] = (
    TURN_QUEUED,
    TURN_STARTED,
    MESSAGE_DELTA,
    MESSAGE_COMPLETED,
    TOOL_CALL,
    TOOL_STARTED,
    TOOL_RESULT,
    DECISION_REQUESTED,
    DECISION_MADE,
    TURN_AWAITING_INPUT,
    TURN_RESUMED,
    MEMORY_RECALLED,
    MEMORY_WRITTEN,
    CONTEXT_COMPACTED,
    HANDOFF,
    TURN_ENDED,
)
