"""The history window of a prompt: the newest items that fit, tool pairs whole, as messages.

:mod:`.prepare` places the window between the instructions and this turn's input. History is
read backwards a page at a time, so the cost follows the size of the window, not the length of
the session; with a memo (a lease's turns share one) the next turn's window starts from the
last one, so it costs what was written since. Tool calls and their results are kept together or
left out together: a model must never see one without the other.
"""

from __future__ import annotations

import operator
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


@dataclass(slots=True)
class _Span:
    """The last window a memo made, for the next one to start from.

    ``seen`` is every history item from the window's oldest to ``before_seq`` (summaries too),
    as the history gave them, oldest first; ``chosen`` the window's own (no summaries, before
    tool pairs are checked). ``messages`` renders ``chosen`` while no tool item is among them
    (then each rendered item is one message of its own)."""

    before_seq: int
    budget: int
    seen: list[Item]
    chosen: list[Item]
    messages: list[Message]
    used: int = 0
    truncated: bool = False
    tools: bool = False


class ItemMemo:
    """What each history item costs in tokens and renders to, and the last window, remembered
    across turns.

    The holder of a session's lease keeps one per lease
    (:meth:`~tether.scheduler.history.HistoryCache.memo`): the next turn's window is the last
    one with the items written since added and the oldest that no longer fit taken off, so a
    long session's turn costs about what a short one's does (walking and rendering the whole
    window again made turn 300 cost 1.3x turn 1). What is remembered serves only the very item
    objects it was made from: an item read again from the store (another lease, a history that
    moved) is measured afresh, and a window whose items the history no longer gives as they
    were is chosen afresh, so what is remembered can never be another item's.
    """

    __slots__ = ("_of", "span")

    def __init__(self) -> None:
        self._of: dict[int, _Entry] = {}
        self.span: _Span | None = None

    def __len__(self) -> int:
        return len(self._of)

    @property
    def entries(self) -> dict[int, _Entry]:
        """The entries by seq, for a loop over many items to look up inline (a method call
        per item was most of what a long window cost); :meth:`entry` makes one when the
        lookup finds none for that very item."""
        return self._of

    def entry(self, item: Item) -> _Entry:
        entry = self._of.get(item.seq)
        if entry is None or entry.item is not item:
            entry = self._of[item.seq] = _Entry(item)
        return entry

    def cost(self, item: Item) -> int:
        return self.entry(item).cost

    def piece(self, item: Item) -> Message | ToolCall:
        entry = self.entry(item)
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
    messages: list[Message] | None = None
    """``render(items)``, when the memo had it at hand (no tool items in the window)."""


_TOOL_KINDS = frozenset(("tool_call", "tool_result"))


async def select_window(
    history: HistoryReader, before_seq: int, budget: int, memo: ItemMemo | None = None
) -> Window:
    """The newest items older than ``before_seq`` whose estimated size fits ``budget``, in order.

    Summary items are not part of the window: the newest one is placed before it separately.
    ``memo`` remembers each item's size, and this window, for the next turn's: that one then
    reads the history once, checks that it still holds the window's items (the very objects),
    adds what is newer, and takes off the oldest items that no longer fit (or, given more room,
    reaches further back), instead of walking and rendering every item again.
    """
    memo = memo if memo is not None else ItemMemo()
    span, memo.span = memo.span, None
    first: tuple[list[Item], int] | None = None
    if span is not None and not (span.seen and span.before_seq <= before_seq):
        span = None
    if span is not None:
        asked = len(span.seen) + before_seq - span.before_seq
        page = await history.recent(before_seq, asked)
        if not _extend(span, page, memo):
            span, first = None, (page, asked)  # the history moved: choose afresh from the page
    grow = span is None or (span.truncated and budget > span.budget)
    if span is None:
        span = _Span(before_seq, budget, [], [], [], truncated=True)
    span.before_seq = before_seq
    if _drop_oldest(span, budget, memo):
        grow = False
    if grow:
        await _grow(history, span, budget, memo, first)
    span.budget = budget
    if span.seen:
        memo.span = span
    memo.keep_only(span.chosen)
    if span.tools:
        return Window(paired(span.chosen), span.truncated)
    return Window(list(span.chosen), span.truncated, list(span.messages))


def _extend(span: _Span, page: list[Item], memo: ItemMemo) -> bool:
    """Add to ``span`` the items of ``page`` (newest first, older than the new window's end)
    newer than its end, if the rest of the page is ``span.seen`` itself; False (``span``
    untouched) if the history no longer holds the span's items as they were."""
    start = span.before_seq
    fresh = 0
    for item in page:
        if item.seq < start:
            break
        fresh += 1
    seen = span.seen
    old = page[fresh : fresh + len(seen)]
    if len(old) != len(seen):
        return False
    old.reverse()
    if not all(map(operator.is_, old, seen)):
        return False
    added = page[:fresh]
    added.reverse()
    for item in added:
        seen.append(item)
        kind = item.kind
        if kind == "summary":
            continue
        span.chosen.append(item)
        span.used += memo.entry(item).cost
        if kind in _TOOL_KINDS:
            span.tools = True
        elif not span.tools and kind in _RENDERED:
            span.messages.append(_message(memo, item))
    return True


def _drop_oldest(span: _Span, budget: int, memo: ItemMemo) -> bool:
    """Take the oldest chosen items off until the rest fit ``budget``; True if any went."""
    if span.used <= budget:
        return False
    chosen = span.chosen
    gone = shown = 0
    while gone < len(chosen) and span.used > budget:
        item = chosen[gone]
        span.used -= memo.entry(item).cost
        shown += item.kind in _RENDERED
        gone += 1
    del chosen[:gone]
    if not span.tools:
        del span.messages[:shown]
    seen = span.seen
    if not chosen:
        seen.clear()
    else:
        oldest, cut = chosen[0], 0
        while seen[cut] is not oldest:
            cut += 1
        del seen[:cut]
    span.truncated = True
    return True


async def _grow(
    history: HistoryReader,
    span: _Span,
    budget: int,
    memo: ItemMemo,
    first: tuple[list[Item], int] | None,
) -> None:
    """Add older items before ``span``'s oldest while they fit: a page at a time, newest
    first, starting with ``first`` (a page already read, and the size asked of it)."""
    entries = memo.entries
    seen: list[Item] = []
    chosen: list[Item] = []
    used = span.used
    tools = span.tools
    full = False
    cursor = span.seen[0].seq if span.seen else span.before_seq
    # Small first page, doubling: a typical window is a few dozen items, and reading a page
    # costs in proportion to its size, not to the session's length.
    size = FIRST_PAGE
    while not full:
        if first is not None:
            (page, size), first = first, None
        else:
            page = await history.recent(cursor, size)
        for item in page:
            kind = item.kind
            if kind == "summary":
                seen.append(item)
                continue
            entry = entries.get(item.seq)
            if entry is None or entry.item is not item:
                entry = memo.entry(item)
            cost = entry.cost
            if used + cost > budget:
                full = True
                break
            seen.append(item)
            chosen.append(item)
            used += cost
            tools = tools or kind in _TOOL_KINDS
        if len(page) < size or not page:
            break
        cursor = page[-1].seq
        size = min(size * 2, MAX_PAGE)
    # ``seen`` may end (at its oldest) with summaries older than the oldest item that fit:
    # still a run of the history without a gap, which is all the next turn's check needs.
    seen.reverse()
    chosen.reverse()
    span.seen[:0] = seen
    span.chosen[:0] = chosen
    span.used = used
    span.truncated = full
    if tools:
        span.tools = True
        span.messages.clear()
    else:
        span.messages[:0] = [_message(memo, i) for i in chosen if i.kind in _RENDERED]


def _message(memo: ItemMemo, item: Item) -> Message:
    """The message an item that is no tool item renders to, remembered."""
    piece = memo.piece(item)
    assert isinstance(piece, Message)
    return piece


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
    entries = memo.entries if memo is not None else None
    out: list[Message] = []
    prev: Item | None = None
    for item in items:
        if item.kind not in _RENDERED:
            prev = item
            continue
        if memo is None or entries is None:
            piece = _piece(item)
        else:
            # The memo's lookup inline: this loop runs over the whole window every turn.
            entry = entries.get(item.seq)
            if entry is None or entry.item is not item:
                entry = memo.entry(item)
            if entry.piece is None:
                entry.piece = _piece(item)
            piece = entry.piece
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
