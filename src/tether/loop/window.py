"""The history window of a prompt: the newest items that fit, tool pairs whole, as messages.

:mod:`.prepare` places the window between the instructions and this turn's input. History is
read backwards a page at a time, so the cost follows the size of the window, not the length of
the session. Tool calls and their results are kept together or left out together: a model must
never see one without the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tether.loop.context import HistoryReader
from tether.models.base import Message, ToolCall
from tether.records import Item

INTERRUPTED_MARK = "[This reply was interrupted before it was finished.]"
FIRST_PAGE = 16
MAX_PAGE = 256
# Conservative characters-per-token: real tokenizers average ~4 on English; estimating low
# keeps a prompt from overflowing a small context window.
CHARS_PER_TOKEN = 3.5
MESSAGE_OVERHEAD = 4


def estimate_tokens(text: str) -> int:
    return int(len(text) / CHARS_PER_TOKEN) + MESSAGE_OVERHEAD


def item_tokens(item: Item) -> int:
    return (
        estimate_tokens(item.content)
        + estimate_tokens(item.arguments or "")
        - (MESSAGE_OVERHEAD if item.arguments else 0)
    )


@dataclass(frozen=True, slots=True)
class Window:
    items: list[Item]
    """The newest items that fit, oldest first, tool pairs whole."""
    truncated: bool
    """True when older items exist that did not fit."""


async def select_window(history: HistoryReader, before_seq: int, budget: int) -> Window:
    """The newest items older than ``before_seq`` whose estimated size fits ``budget``, in order.

    Summary items are not part of the window: the newest one is placed before it separately.
    """
    chosen: list[Item] = []
    used = 0
    cursor = before_seq
    full = False
    # Small first page, doubling: a typical window is a few dozen items, and reading a page
    # costs in proportion to its size, not to the session's length.
    size = FIRST_PAGE
    while not full:
        page = await history.recent(cursor, size)
        for item in page:
            if item.kind == "summary":
                continue
            cost = item_tokens(item)
            if used + cost > budget:
                full = True
                break
            chosen.append(item)
            used += cost
        if len(page) < size:
            break
        cursor = page[-1].seq
        size = min(size * 2, MAX_PAGE)
    chosen.reverse()
    return Window(paired(chosen), full)


def paired(items: list[Item]) -> list[Item]:
    """Drop tool calls without their result and results without their call."""
    calls = {i.call_id for i in items if i.kind == "tool_call"}
    results = {i.call_id for i in items if i.kind == "tool_result"}
    return [
        i
        for i in items
        if not (i.kind == "tool_call" and i.call_id not in results)
        and not (i.kind == "tool_result" and i.call_id not in calls)
    ]


def render(items: Sequence[Item]) -> list[Message]:
    """History items as chat messages; a step's text and tool calls become one message."""
    out: list[Message] = []
    prev: Item | None = None
    for item in items:
        if item.kind == "user":
            out.append(Message("user", item.content))
        elif item.kind == "summary":
            out.append(Message("system", f"Summary of the earlier conversation:\n{item.content}"))
        elif item.kind == "assistant":
            text = item.content if item.complete else f"{item.content}\n{INTERRUPTED_MARK}".strip()
            out.append(Message("assistant", text))
        elif item.kind == "tool_call":
            call = ToolCall(item.call_id or "", item.tool_name or "", item.arguments or "{}")
            # A step's text and its calls, or several calls of one step, are one message.
            same_step = (
                prev is not None
                and prev.kind in ("assistant", "tool_call")
                and prev.turn_id == item.turn_id
                and prev.meta.get("step") == item.meta.get("step")
                and out
                and out[-1].role == "assistant"
            )
            if same_step:
                last = out[-1]
                out[-1] = Message("assistant", last.content, (*last.tool_calls, call))
            else:
                out.append(Message("assistant", "", (call,)))
        elif item.kind == "tool_result":
            out.append(Message("tool", item.content, tool_call_id=item.call_id))
        prev = item
    return out
