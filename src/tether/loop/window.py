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
from dataclasses import dataclass, field
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
class _Group:
    """Consecutive window items, and what they render to: either a run of turns without tool
    items (``plain``: each item renders to a message of its own, or to none), or the items of
    one turn with tool items, its tool pairs made whole within it (a turn writes its calls'
    results itself) and a step's text and calls merged into one message (never across
    turns)."""

    items: list[Item]
    kept: list[Item]
    """``items`` without a call whose result is not among them, or a result whose call is not
    (for a plain group, ``items`` itself)."""
    messages: list[Message]
    plain: bool
    whole: bool = True
    """Nothing was left out of ``kept``."""


@dataclass(slots=True)
class _Span:
    """The last window a memo made, for the next one to start from.

    ``seen`` is every history item from the window's oldest to ``before_seq`` (summaries too),
    as the history gave them, oldest first; ``chosen`` the window's own (no summaries, before
    tool pairs are checked), in ``groups``; ``kept`` and ``messages`` are the groups' own end
    to end. When no group but the oldest left anything out, they are the window's items and
    its rendering (the oldest may have lost a result whose call fell off the window's edge;
    call ids are unique in a session, so no other group holds that call)."""

    before_seq: int
    budget: int
    seen: list[Item] = field(default_factory=list)
    chosen: list[Item] = field(default_factory=list)
    groups: list[_Group] = field(default_factory=list)
    kept: list[Item] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    used: int = 0
    truncated: bool = False
    broken: int = 0
    """Groups that are not whole."""

    def whole(self) -> bool:
        return self.broken == 0 or (self.broken == 1 and not self.groups[0].whole)

    def append(self, items: list[Item], memo: ItemMemo) -> None:
        """Groups for ``items`` (chosen, oldest first), after the newest."""
        new = _grouped(items, memo)
        if not new:
            return
        if self.groups:
            last, head = self.groups[-1], new[0]
            if last.items[-1].turn_id == head.items[0].turn_id and not (last.plain and head.plain):
                self.rebuild(memo)  # a turn in both (not seen in practice): group it afresh
                return
            if last.plain and head.plain:
                last.items += head.items
                last.messages += head.messages
                self.kept += head.items
                self.messages += head.messages
                new = new[1:]
        for group in new:
            self.groups.append(group)
            self.kept += group.kept
            self.messages += group.messages
            self.broken += not group.whole

    def prepend(self, items: list[Item], memo: ItemMemo) -> None:
        """Groups for ``items`` (chosen, oldest first), before the oldest."""
        new = _grouped(items, memo)
        if not new:
            return
        if self.groups:
            first, end = self.groups[0], new[-1]
            same_turn = first.items[0].turn_id == end.items[-1].turn_id
            if same_turn and not (first.plain and end.plain):
                self.rebuild(memo)  # a turn cut at the window's edge, with tool items
                return
            if first.plain and end.plain:
                first.items[:0] = end.items
                first.messages[:0] = end.messages
                self.kept[:0] = end.items
                self.messages[:0] = end.messages
                new = new[:-1]
        self.groups[:0] = new
        self.kept[:0] = [i for g in new for i in g.kept]
        self.messages[:0] = [m for g in new for m in g.messages]
        self.broken += sum(not g.whole for g in new)

    def drop(self, count: int, memo: ItemMemo) -> None:
        """Take the oldest ``count`` chosen items out of the groups."""
        while count:
            first = self.groups[0]
            if first.plain and len(first.items) > count:
                shown = sum(i.kind in _RENDERED for i in first.items[:count])
                del first.items[:count], first.messages[:shown]  # kept is items
                del self.kept[:count], self.messages[:shown]
                return
            del self.groups[0]
            del self.kept[: len(first.kept)], self.messages[: len(first.messages)]
            self.broken -= not first.whole
            if len(first.items) > count:  # a tool turn cut: group what is left of it afresh
                self.prepend(first.items[count:], memo)
                return
            count -= len(first.items)

    def rebuild(self, memo: ItemMemo) -> None:
        """The groups of ``chosen`` made afresh."""
        self.groups = _grouped(self.chosen, memo)
        self.kept = [i for g in self.groups for i in g.kept]
        self.messages = [m for g in self.groups for m in g.messages]
        self.broken = sum(not g.whole for g in self.groups)


def _grouped(items: list[Item], memo: ItemMemo) -> list[_Group]:
    """``items`` (consecutive, oldest first) in groups: a turn with tool items on its own, the
    turns between them together."""
    out: list[_Group] = []
    entries = memo.entries
    count, start = len(items), 0
    while start < count:
        turn, end, tools = items[start].turn_id, start, False
        while end < count and items[end].turn_id == turn:
            tools = tools or items[end].kind in _TOOL_KINDS
            end += 1
        part = items[start:end]
        start = end
        if tools:
            kept = paired(part)
            out.append(_Group(part, kept, render(kept, memo), False, len(kept) == len(part)))
            continue
        shown: list[Message] = []
        for item in part:
            if item.kind in _RENDERED:
                # The memo's lookup inline: a window made afresh renders every item.
                entry = entries.get(item.seq)
                if entry is None or entry.item is not item:
                    entry = memo.entry(item)
                if entry.piece is None:
                    entry.piece = _piece(item)
                assert isinstance(entry.piece, Message)
                shown.append(entry.piece)
        if out and out[-1].plain:
            out[-1].items += part  # its kept is its items
            out[-1].messages += shown
        else:
            out.append(_Group(part, part, shown, True))
    return out


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
    """``render(items)``, when the memo had it at hand: the same message objects turn after
    turn (so that a model can remember what it made of them)."""


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
        span = _Span(before_seq, budget, truncated=True)
    span.before_seq = before_seq
    if _drop_oldest(span, budget, memo):
        grow = False
    if grow:
        await _grow(history, span, budget, memo, first)
    span.budget = budget
    if span.seen:
        memo.span = span
    memo.keep_only(span.chosen)
    if not span.whole():
        # A turn's calls without their results (or results without calls) in the window:
        # pair them over the whole window, as a window made afresh does.
        return Window(paired(span.chosen), span.truncated)
    return Window(list(span.kept), span.truncated, list(span.messages))


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
    chosen: list[Item] = []
    for item in added:
        seen.append(item)
        if item.kind != "summary":
            chosen.append(item)
            span.used += memo.entry(item).cost
    span.chosen += chosen
    span.append(chosen, memo)
    return True


def _drop_oldest(span: _Span, budget: int, memo: ItemMemo) -> bool:
    """Take the oldest chosen items off until the rest fit ``budget``; True if any went."""
    if span.used <= budget:
        return False
    chosen = span.chosen
    gone = 0
    while gone < len(chosen) and span.used > budget:
        span.used -= memo.entry(chosen[gone]).cost
        gone += 1
    del chosen[:gone]
    span.drop(gone, memo)
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
    span.prepend(chosen, memo)


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
