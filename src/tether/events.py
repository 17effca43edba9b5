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
    "tool.approval_requested",
    "tool.result",
    "memory.recalled",
    "memory.written",
    "context.compacted",
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
TOOL_APPROVAL_REQUESTED: Final = "tool.approval_requested"
TOOL_RESULT: Final = "tool.result"
MEMORY_RECALLED: Final = "memory.recalled"
"""Ids, scopes and provenance of what recall placed in the prompt (never the text)."""
MEMORY_WRITTEN: Final = "memory.written"
"""A memory item the turn kept (an automatic note, or the model's ``remember``): its id, scope,
kind, author and text. Emitted with the ending that commits it, so never for a note dropped
with a failed or rolled-back turn."""
CONTEXT_COMPACTED: Final = "context.compacted"
TURN_ENDED: Final = "turn.ended"
"""Terminal, exactly once per turn, with ``status`` and ``reason``."""

EVENT_TYPES: Final[tuple[EventType, ...]] = (
    TURN_QUEUED,
    TURN_STARTED,
    MESSAGE_DELTA,
    MESSAGE_COMPLETED,
    TOOL_CALL,
    TOOL_APPROVAL_REQUESTED,
    TOOL_RESULT,
    MEMORY_RECALLED,
    MEMORY_WRITTEN,
    CONTEXT_COMPACTED,
    TURN_ENDED,
)
