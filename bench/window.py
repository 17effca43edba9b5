"""What assembling a turn's prompt costs as a session grows: the window, its messages, the JSON.

Reproduce (from the repository root)::

    .venv/bin/python bench/window.py
    .venv/bin/python bench/window.py --tools     # every turn also makes a tool call

A session of ``N`` items (a user message and a reply a turn, or with ``--tools`` a call and
its result too), held in memory as the lease's history cache holds it. For each ``N``, CPU
microseconds a turn, median of five rounds of 200 turns:

* ``next turn``: the lease's memo carries the last window to the next turn, which adds the
  items the turn before wrote (what a conversation's turns cost while its lease is held);
* ``afresh``: a new memo every turn (what a session's first turn under a new lease costs).

Each turn is ``select_window`` (loop/window.py), the window's messages (``render`` where the
memo does not have them) and the request's JSON array of them (``Encoded.array``,
models/openai_messages.py; ``afresh`` starts a new one too, so every message is encoded). The budget
holds exactly ``N`` items: each turn's window takes the two (four) items of the turn before and
lets the oldest turn's go, as a long session's window does once it is full.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import statistics
import time

from tether.loop.window import ItemMemo, Window, item_tokens, render, select_window
from tether.models.base import Message
from tether.models.openai_messages import Encoded
from tether.records import Item, ItemKind

SIZES = (50, 300, 600, 1200)
TURNS = 200
ROUNDS = 5


class History:
    """The items of one session as the lease's cache gives them: the same objects each time."""

    def __init__(self) -> None:
        self.items: list[Item] = []

    def add_turn(self, tools: bool) -> None:
        seq = self.items[-1].seq + 1 if self.items else 0
        turn = f"t{seq}"
        kinds: list[tuple[ItemKind, str, dict[str, object]]] = [
            ("user", "what about item " * 4, {})
        ]
        if tools:
            kinds += [("tool_call", "", {"step": 0}), ("tool_result", "found " * 20, {})]
        kinds.append(("assistant", "the answer is " * 12, {"step": 1}))
        for n, (kind, text, meta) in enumerate(kinds):
            call = f"c{seq}" if kind.startswith("tool") else None
            self.items.append(
                Item(
                    seq + n,
                    turn,
                    kind,
                    text,
                    True,
                    call,
                    "find" if call else None,
                    "{}" if kind == "tool_call" else None,
                    meta,
                    0.0,
                )
            )

    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        end = (
            len(self.items)
            if before_seq is None
            else bisect.bisect_left(self.items, before_seq, key=lambda i: i.seq)
        )
        return self.items[max(end - limit, 0) : end][::-1]

    async def latest_summary(self) -> Item | None:
        return None


async def turn_cost(size: int, tools: bool, keep: bool) -> float:
    history = History()
    while len(history.items) < size:
        history.add_turn(tools)
    budget = sum(item_tokens(i) for i in history.items[-size:])
    memo, encoded = ItemMemo(), Encoded()
    rounds: list[float] = []
    for _ in range(ROUNDS):
        start = time.process_time()
        for _ in range(TURNS):
            if not keep:
                memo = ItemMemo()
            window: Window = await select_window(history, history.items[-1].seq + 1, budget, memo)
            if not keep:
                encoded = Encoded()
            # (A tool result whose call did not fit is left out with it.)
            assert size - 1 <= len(window.items) <= size
            messages = (
                window.messages if window.messages is not None else render(window.items, memo)
            )
            encoded.array([Message("system", "instructions"), *messages, Message("user", "next")])
            history.add_turn(tools)  # the turn's own items, for the next turn's window
        rounds.append((time.process_time() - start) / TURNS * 1e6)
    return statistics.median(rounds)


async def main_async(tools: bool) -> None:
    print(
        f"prompt assembly, CPU us a turn (median of {ROUNDS} x {TURNS} turns)"
        + (", a tool call every turn" if tools else "")
    )
    print(f"{'items':>6} {'next turn':>10} {'afresh':>10}")
    for size in SIZES:
        kept = await turn_cost(size, tools, keep=True)
        fresh = await turn_cost(size, tools, keep=False)
        print(f"{size:>6} {kept:>10.1f} {fresh:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", action="store_true", help="a tool call and result each turn")
    asyncio.run(main_async(parser.parse_args().tools))


if __name__ == "__main__":
    main()
