"""The window's memo (loop/window.py ItemMemo): a long session's turn does not measure and render
its whole history again, and what the memo remembers is never shown in place of what the history
holds."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import pytest

from tether.loop import window
from tether.loop.window import ItemMemo, render, select_window
from tether.models.base import Message, ToolCall
from tether.records import Item


def _item(seq: int, kind: str, content: str = "", **kw: object) -> Item:
    fields: dict[str, object] = {
        "turn_id": f"t{seq // 10}",
        "complete": True,
        "call_id": None,
        "tool_name": None,
        "arguments": None,
        "meta": {},
        "created_at": 0.0,
    }
    fields.update(kw)
    return Item(seq=seq, kind=kind, content=content, **fields)  # type: ignore[arg-type]


def _call(seq: int, call_id: str, arguments: str) -> Item:
    return _item(
        seq, "tool_call", call_id=call_id, tool_name="find", arguments=arguments, meta={"step": 1}
    )


class _Reader:
    """A history as the scheduler's cache gives it: the same item objects turn after turn."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = list(items)

    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        older = [i for i in self.items if before_seq is None or i.seq < before_seq]
        return older[-limit:][::-1] if limit > 0 else []

    async def latest_summary(self) -> Item | None:
        return None


def _seqs_through(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """The seqs of the items that ``window.<name>`` (a function of one item) is called with
    from now on, in order."""
    seqs: list[int] = []
    real = getattr(window, name)

    def counting(item: Item) -> object:
        seqs.append(item.seq)
        return real(item)

    monkeypatch.setattr(window, name, counting)
    return seqs


def _mixed() -> list[Item]:
    """Every kind a window renders: text, a step with text and two calls, their results, an
    interrupted reply, a handoff (never shown) and a summary (kept out of the window)."""
    return [
        _item(0, "user", "hello"),
        _item(1, "assistant", "let me look", meta={"step": 1}),
        _call(2, "c1", '{"q": 1}'),
        _call(3, "c2", '{"q": 2}'),
        _item(4, "tool_result", "one", call_id="c1"),
        _item(5, "tool_result", "two", call_id="c2"),
        _item(6, "handoff", "other", meta={"agent": "a"}),
        _item(7, "assistant", "half a rep", complete=False),
        _item(8, "summary", "earlier things"),
        _item(10, "user", "and then?"),
        _call(11, "c3", "{}"),
    ]


async def test_a_window_through_the_memo_is_the_window_without_it() -> None:
    items = _mixed()
    reader = _Reader(items)
    memo = ItemMemo()
    for budget in (10_000, 40, 12):
        plain = await select_window(reader, 12, budget)
        # Twice through the same memo: the second time every item is remembered.
        for _ in range(2):
            memoised = await select_window(reader, 12, budget, memo)
            assert memoised == plain
            assert render(memoised.items, memo) == render(plain.items)
    whole = render((await select_window(reader, 12, 10_000, memo)).items, memo)
    assert whole == [
        Message("user", "hello"),
        Message(
            "assistant",
            "let me look",
            (ToolCall("c1", "find", '{"q": 1}'), ToolCall("c2", "find", '{"q": 2}')),
        ),
        Message("tool", "one", tool_call_id="c1"),
        Message("tool", "two", tool_call_id="c2"),
        Message("assistant", f"half a rep\n{window.INTERRUPTED_MARK}"),
        Message("user", "and then?"),
        # c3 has no result yet: left out with it.
    ]


async def test_the_next_turns_window_measures_only_the_new_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    measured = _seqs_through(monkeypatch, "item_tokens")
    items = [_item(n, "user" if n % 2 == 0 else "assistant", f"message {n}") for n in range(400)]
    reader = _Reader(items[:300])
    memo = ItemMemo()
    await select_window(reader, 300, 1_000_000, memo)
    assert sorted(measured) == list(range(300))
    measured.clear()
    reader.items = items  # a hundred more items since (the cache holds the same objects)
    chosen = await select_window(reader, 400, 1_000_000, memo)
    assert len(chosen.items) == 400
    assert sorted(measured) == list(range(300, 400))


async def test_an_item_read_again_is_measured_again_never_taken_for_the_old_one() -> None:
    """Same seq, another item (the history was cleared and written again, or read afresh from
    the store under a new lease): the memo's entry is for the old object, so it is not used."""
    memo = ItemMemo()
    old = _Reader([_item(0, "user", "short"), _item(1, "assistant", "x")])
    await select_window(old, 2, 1_000, memo)
    render(old.items, memo)
    new = _Reader([_item(0, "user", "a much longer question " * 20), _item(1, "assistant", "y")])
    fits = await select_window(new, 2, window.item_tokens(new.items[1]) + 1, memo)
    assert [i.content for i in fits.items] == ["y"]  # the new user item's own size counted
    assert render(new.items, memo) == render(new.items)


async def test_the_memo_stays_the_size_of_a_window() -> None:
    memo = ItemMemo()
    items = [_item(n, "user", "m" * 70) for n in range(2_000)]
    reader = _Reader(items)
    for end in range(100, 2_001, 100):
        chosen = await select_window(reader, end, 500, memo)
        render(chosen.items, memo)
        assert len(memo) <= 2 * len(chosen.items) + 64


class _CountingReader(_Reader):
    def __init__(self, items: Sequence[Item]) -> None:
        super().__init__(items)
        self.reads = 0

    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        self.reads += 1
        return await super().recent(before_seq, limit)


async def test_the_next_turns_window_reads_once_and_renders_only_the_new_items(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last window is the next one's start: one read of the history, and the messages of
    the items it already held are the very objects it rendered before."""
    rendered = _seqs_through(monkeypatch, "_piece")
    items = [_item(n, "user" if n % 2 == 0 else "assistant", f"message {n}") for n in range(602)]
    reader = _CountingReader(items[:600])
    memo = ItemMemo()
    first = await select_window(reader, 600, 1_000_000, memo)
    assert reader.reads > 1  # a fresh window walks back a page at a time
    assert first.messages == render(first.items)
    reader.items, reader.reads = items, 0
    rendered.clear()
    second = await select_window(reader, 602, 1_000_000, memo)
    assert reader.reads == 1
    assert rendered == [600, 601]
    assert second.items == items
    assert second.messages is not None and first.messages is not None
    assert all(a is b for a, b in zip(second.messages, first.messages, strict=False))
    assert second.messages == render(items)


def _turn(rng: random.Random, seq: int, turn: int) -> list[Item]:
    """One turn's items at ``seq``: a user message, then text, tool steps, a handoff, a
    summary, an interrupted reply, as chance has it."""
    tid = f"turn{turn}"
    out = [_item(seq, "user", "u" * rng.randint(1, 60), turn_id=tid)]
    for step in range(rng.choice((0, 0, 1, 2))):
        calls = [f"c{turn}-{step}-{n}" for n in range(rng.randint(1, 2))]
        for call in calls:
            meta = {"step": step}
            out.append(
                _item(
                    0,
                    "tool_call",
                    turn_id=tid,
                    call_id=call,
                    tool_name="f",
                    arguments="{}",
                    meta=meta,
                )
            )
        out += [
            _item(0, "tool_result", "r" * rng.randint(1, 40), turn_id=tid, call_id=c) for c in calls
        ]
    if rng.random() < 0.1:
        out.append(_item(0, "handoff", "other", turn_id=tid, meta={"agent": "a"}))
    if rng.random() < 0.1:
        out.append(_item(0, "summary", "s" * rng.randint(1, 80), turn_id=tid))
    complete = rng.random() > 0.1
    out.append(_item(0, "assistant", "a" * rng.randint(0, 120), turn_id=tid, complete=complete))
    return [
        Item(
            seq + n,
            i.turn_id,
            i.kind,
            i.content,
            i.complete,
            i.call_id,
            i.tool_name,
            i.arguments,
            i.meta,
            0.0,
        )
        for n, i in enumerate(out)
    ]


def _walked(items: list[Item], before: int, budget: int) -> tuple[list[Item], bool]:
    """The window as the first release chose it, as plainly as it can be said: the newest items
    before ``before`` that fit (summaries aside), tool pairs whole over all of them."""
    chosen: list[Item] = []
    used = 0
    for item in reversed([i for i in items if i.seq < before and i.kind != "summary"]):
        if used + window.item_tokens(item) > budget:
            return window.paired(chosen[::-1]), True
        chosen.append(item)
        used += window.item_tokens(item)
    return window.paired(chosen[::-1]), False


@pytest.mark.parametrize("seed", range(40))
async def test_a_window_made_from_the_last_one_is_the_window_made_afresh(seed: int) -> None:
    """Turn after turn through one memo (the history growing, the budget moving, the last turn
    rolled back, items read again as new objects, a gap in the seqs): every window is the one
    a fresh walk of the history chooses, and its messages are what ``render`` makes of it."""
    rng = random.Random(seed)
    reader = _Reader([])
    memo = ItemMemo()
    seq = turn = 0
    for _ in range(60):
        action = rng.random()
        if action < 0.08 and reader.items:
            last = reader.items[-1].turn_id  # the last turn rolled back
            reader.items = [i for i in reader.items if i.turn_id != last]
        elif action < 0.14:
            reader.items = [dataclasses.replace(i) for i in reader.items]  # read again
        elif action < 0.18:
            seq += rng.randint(1, 5)  # a change without the lease leaves a gap
        else:
            added = _turn(rng, seq, turn)
            reader.items += added
            seq, turn = added[-1].seq + 1, turn + 1
        before = seq + rng.choice((0, 0, 0, 1))
        budget = rng.choice((30, 80, 200, 500, 2_000, 100_000))
        for _ in range(rng.choice((1, 1, 2))):
            made = await select_window(reader, before, budget, memo)
            fresh = await select_window(reader, before, budget)
            assert made.items == fresh.items and made.truncated == fresh.truncated
            assert all(a is b for a, b in zip(made.items, fresh.items, strict=True))
            assert (made.items, made.truncated) == _walked(reader.items, before, budget)
            if made.messages is not None:
                assert made.messages == render(fresh.items)
            budget = rng.choice((budget, budget // 2, budget * 2))


async def test_a_window_with_tool_steps_keeps_its_messages_turn_after_turn() -> None:
    """A step's text and calls are one message, made once: the next turn's window gives the
    very same message objects for the turns it already held (a model remembers what it made
    of them by identity), and only the new turn's are made."""
    rng = random.Random(7)
    reader = _Reader([])
    seq = 0
    for turn in range(40):
        added = _turn(rng, seq, turn)
        reader.items += added
        seq = added[-1].seq + 1
    memo = ItemMemo()
    first = await select_window(reader, seq, 1_000_000, memo)
    assert first.messages is not None
    assert any(m.tool_calls for m in first.messages)
    added = _turn(random.Random(8), seq, 40)
    reader.items += added
    second = await select_window(reader, added[-1].seq + 1, 1_000_000, memo)
    assert second.messages is not None
    assert second.messages == render(
        (await select_window(reader, added[-1].seq + 1, 1_000_000)).items
    )
    held = len(first.messages)
    assert all(a is b for a, b in zip(second.messages[:held], first.messages, strict=True))
