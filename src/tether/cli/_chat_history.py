"""A session's earlier exchanges, as the chat shows them (on resuming, and for ``/history``).

An exchange is one turn: the user's message and what the agent answered (tool calls included).
Items come from the local store or from a server's ``/items`` pages; only the newest exchanges
are kept while they stream past, so a long session is never held whole.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from tether.records import Item

SHOWN_CHARS = 400
"""Longer messages are cut to this in the view (the stored history is whole)."""


@dataclass(frozen=True, slots=True)
class HistoryItem:
    turn_id: str
    kind: str
    content: str
    complete: bool = True
    excluded: bool = False
    tool_name: str | None = None
    arguments: str | None = None

    @classmethod
    def of(cls, item: Item) -> HistoryItem:
        return cls(
            item.turn_id,
            item.kind,
            item.content,
            item.complete,
            item.excluded,
            item.tool_name,
            item.arguments,
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HistoryItem:
        return cls(
            str(data.get("turn_id", "")),
            str(data.get("kind", "")),
            str(data.get("content", "")),
            bool(data.get("complete", True)),
            bool(data.get("excluded", False)),
            data.get("tool_name"),
            data.get("arguments"),
        )


@dataclass
class Exchange:
    turn_id: str
    items: list[HistoryItem] = field(default_factory=list)


class Exchanges:
    """Collects items in order and keeps the newest ``keep`` exchanges."""

    def __init__(self, keep: int) -> None:
        self._kept: deque[Exchange] = deque(maxlen=keep)
        self.total = 0

    def add(self, item: HistoryItem) -> None:
        # A failed or rolled-back turn's items are kept for audit, never shown as said; summaries
        # stand for older items, not for anything the user typed.
        if item.excluded or item.kind == "summary":
            return
        if not self._kept or self._kept[-1].turn_id != item.turn_id:
            self._kept.append(Exchange(item.turn_id))
            self.total += 1
        self._kept[-1].items.append(item)

    @property
    def newest(self) -> list[Exchange]:
        return list(self._kept)


def show(out: Console, exchanges: Exchanges, agent: str, *, hint: str = "") -> None:
    """Print the kept exchanges, dimmed, so they are not mistaken for the live conversation."""
    shown = exchanges.newest
    if not shown:
        out.print("no messages in this session yet", style="dim")
        return
    scope = (
        f"the last {len(shown)} of {exchanges.total} exchanges"
        if exchanges.total > len(shown)
        else ("the one exchange" if len(shown) == 1 else f"all {len(shown)} exchanges")
    )
    out.print(f"── earlier in this session: {scope}{hint} ──", style="dim", markup=False)
    for exchange in shown:
        for item in exchange.items:
            line = _line(item, agent)
            if line:
                out.print(line, style="dim", markup=False, highlight=False)
    out.print("──", style="dim")


def _line(item: HistoryItem, agent: str) -> str | None:
    if item.kind == "user":
        return f"you: {_cut(item.content)}"
    if item.kind == "assistant" and item.content:
        return f"{agent}: {_cut(item.content)}" + ("" if item.complete else " [incomplete]")
    if item.kind == "tool_call":
        return f"  → {item.tool_name}({_cut(item.arguments or '', 120)})"
    if item.kind == "tool_result":
        return f"  ← {_cut(item.content, 120)}"
    if item.kind == "handoff":
        return f"  ⇢ handed to {item.content}"
    return None


def _cut(text: str, limit: int = SHOWN_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
