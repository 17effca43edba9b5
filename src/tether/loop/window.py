"""The history window of a prompt: the newest items that fit, tool pairs whole, as messages.

:mod:`.prepare` places the window between the instructions and this turn's input. History is
read backwards a page at a time, so the cost follows the size of the window, not the length of
the session. Tool calls and their results are kept together or left out together: a model must
never see one without the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tether.models.base import Message, ToolCall
from tether.records import Item

if TYPE_CHECKING:
    from tether.loop.context import HistoryReader

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


class _Entry:
    __slots__ = ("cost", "item", "piece")

    def __init__(self, item: Item) -> None:
        self.item = item
        self.cost = item_tokens(item)
        self.piece: Message | ToolCall | None = None


class ItemMemo:
    """What each history item costs in tokens and renders to, remembered across turns.

    The holder of a session's lease keeps one per lease
    (:meth:`~tether.scheduler.history.HistoryCache.memo`): a turn's window then costs a lookup
    per item, not an estimate and a rendering of every item again, so a long session's turn
    costs about what a short one's does. An entry serves only the very item object it was made
    from; an item read again from the store (another lease, a history that moved) is measured
    afresh, so what is remembered can never be another item's.
    """

    __slots__ = ("_of",)

    def __init__(self) -> None:
        self._of: dict[int, _Entry] = {}

    def __len__(self) -> int:
        return len(self._of)

    def _entry(self, item: Item) -> _Entry:
        entry = self._of.get(item.seq)
        if entry is None or entry.item is not item:
            entry = self._of[item.seq] = _Entry(item)
        return entry

    def cost(self, item: Item) -> int:
        return self._entry(item).cost

    def piece(self, item: Item) -> Message | ToolCall:
        entry = self._entry(item)
        if entry.piece is None:
            entry.piece = _piece(item)
        return entry.piece

    def keep_only(self, items: Sequence[Item]) -> None:
        """Forget what ``items`` (the window just chosen) do not need, once the memo holds
        far more: it stays the size of a window, not of the session."""
        if len(self._of) > 2 * len(items) + 64:
            of = self._of
            self._of = {i.seq: of[i.seq] for i in items if i.seq in of}


@dataclass(frozen=True, slots=True)
class Window:
    items: list[Item]
    """The newest items that fit, oldest first, tool pairs whole."""
    truncated: bool
    """True when older items exist that did not fit."""


async def select_window(
    history: HistoryReader, before_seq: int, budget: int, memo: ItemMemo | None = None
) -> Window:
    """The newest items older than ``before_seq`` whose estimated size fits ``budget``, in order.

    Summary items are not part of the window: the newest one is placed before it separately.
    ``memo`` remembers each item's size for the next turn's window.
    """
    memo = memo if memo is not None else ItemMemo()
    cost_of = memo.cost
    chosen: list[Item] = []
    used = 0
    cursor = before_seq
    full = False
    tools = False
    # Small first page, doubling: a typical window is a few dozen items, and reading a page
    # costs in proportion to its size, not to the session's length.
    size = FIRST_PAGE
    while not full:
        page = await history.recent(cursor, size)
        for item in page:
            kind = item.kind
            if kind == "summary":
                continue
            cost = cost_of(item)
            if used + cost > budget:
                full = True
                break
            chosen.append(item)
            used += cost
            tools = tools or kind == "tool_call" or kind == "tool_result"
        if len(page) < size:
            break
        cursor = page[-1].seq
        size = min(size * 2, MAX_PAGE)
    chosen.reverse()
    memo.keep_only(chosen)
    return Window(paired(chosen) if tools else chosen, full)


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


def _piece(item: Item) -> Message | ToolCall:
    """What one item renders to on its own: a message, or (a tool call) the call that joins
    its step's message."""
    kind = item.kind
    if kind == "tool_call":
        return ToolCall(item.call_id or "", item.tool_name or "", item.arguments or "{}")
    if kind == "user":
        return Message("user", item.content)
    if kind == "summary":
        return Message("system", f"Summary of the earlier conversation:\n{item.content}")
    if kind == "assistant":
        text = item.content if item.complete else f"{item.content}\n{INTERRUPTED_MARK}".strip()
        return Message("assistant", text)
    # A tool result: render passes no other kind.
    return Message("tool", item.content, tool_call_id=item.call_id)


_RENDERED = frozenset(("user", "summary", "assistant", "tool_call", "tool_result"))


def render(items: Sequence[Item], memo: ItemMemo | None = None) -> list[Message]:
    """History items as chat messages; a step's text and tool calls become one message.

    Other kinds (handoffs, say) are not shown to the model."""
    piece_of = memo.piece if memo is not None else _piece
    out: list[Message] = []
    prev: Item | None = None
    for item in items:
        if item.kind not in _RENDERED:
            prev = item
            continue
        piece = piece_of(item)
        if isinstance(piece, Message):
            out.append(piece)
        else:
            call = piece
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
        prev = item
    return out
