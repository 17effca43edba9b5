"""History items and events: what a turn writes, as it produces them and as they are stored."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from tether.events import EventType

ItemKind = Literal["user", "assistant", "tool_call", "tool_result", "summary", "handoff"]
"""A ``handoff`` item records a transfer between agents: its content is the agent handed to,
``meta["agent"]`` the one that handed off. It never reaches a model (the transfer's tool call
and result do)."""

ABORTED_TOOL_RESULT: Final = "Tool call aborted: the turn ended before the tool returned a result."
"""The result every tool call left unanswered by a turn's ending gets (DESIGN §3 pairing)."""


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item as the turn loop produces it; the store assigns ``seq`` when it commits."""

    kind: ItemKind
    content: str = ""
    complete: bool = True
    """False for a partial assistant reply of a cancelled or interrupted turn."""
    call_id: str | None = None
    tool_name: str | None = None
    arguments: str | None = None
    """JSON text, tool calls only."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Item:
    seq: int
    turn_id: str
    kind: ItemKind
    content: str
    complete: bool
    call_id: str | None
    tool_name: str | None
    arguments: str | None
    meta: dict[str, Any]
    created_at: float
    excluded: bool = False
    """True when the item's turn ended failed; such items are kept for audit only."""


@dataclass(slots=True)
class NewEvent:
    """An event as a turn produces it; ``seq`` is assigned by the turn's single writer.

    Not frozen: one is made per streamed token, and a frozen dataclass costs twice as much to
    build."""

    seq: int
    type: EventType
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a turn; ``seq`` is per turn, so ``(turn_id, seq)`` names it for replay."""

    turn_id: str
    seq: int
    type: EventType
    data: dict[str, Any]
    created_at: float
