"""Long conversations: what falls out of the prompt's window is summarised, not forgotten.

When older items no longer fit, the model summarises them (with the previous summary, if any)
into a ``summary`` item committed with the turn; the newest summary goes before the window in
later prompts. Raw history is never deleted. A summary is made only once enough items have
fallen out since the last one (a model call per turn would double a small model's latency), and
reads at most a bounded slice of them (the newest), so a first compaction of a very long
session costs one model call, not one per page.
"""

from __future__ import annotations

import logging

from tether.errors import ModelError
from tether.events import CONTEXT_COMPACTED
from tether.loop.context import TurnContext
from tether.loop.state import TurnState
from tether.loop.window import estimate_tokens, item_tokens, paired, render
from tether.models.base import Message, ModelRequest, TextDelta
from tether.models.base import Usage as ModelUsage
from tether.records import Item, NewItem

log = logging.getLogger("tether.loop")

MIN_NEW_ITEMS = 8
"""Items that must have fallen out since the last summary before another is made."""
MAX_INPUT_TOKENS = 3_000
SUMMARY_TOKENS = 256
PROMPT = (
    "Summarise the conversation below for your own later reference: who the user is, what they "
    "asked for, what was decided or answered, and anything still open. Keep names, numbers and "
    "facts exactly. Write at most 120 words of plain text."
)


async def summarise(
    ctx: TurnContext, state: TurnState, previous: Item | None, first_kept_seq: int
) -> Item | None:
    """A new summary covering everything before ``first_kept_seq``, or None when not due.

    The summary is committed through the turn's fenced sink, so a stale owner cannot write one.
    """
    covered = int(previous.meta.get("upto_seq", 0)) if previous is not None else 0
    if first_kept_seq - covered - 1 < MIN_NEW_ITEMS:
        # Seqs count every item, so fewer seqs than that cannot hold enough items: no read.
        return None
    budget = min(MAX_INPUT_TOKENS, max(256, ctx.model.context_window // 2))
    gap: list[Item] = []
    used = 0
    cursor = first_kept_seq
    more = True
    while more and used < budget:
        page = await ctx.history.recent(cursor, 64)
        more = len(page) == 64
        for item in page:
            if item.seq <= covered:
                more = False
                break
            cursor = item.seq
            if item.kind == "summary":
                continue
            cost = item_tokens(item)
            if used + cost > budget:
                more = False
                break
            gap.append(item)
            used += cost
    if len(gap) < MIN_NEW_ITEMS:
        return None
    gap.reverse()
    messages: list[Message] = [Message("system", PROMPT)]
    if previous is not None:
        messages.append(Message("user", f"Summary so far:\n{previous.content}"))
    transcript = "\n".join(
        f"{m.role}: {m.content}"
        + (f" [called {', '.join(c.name for c in m.tool_calls)}]" if m.tool_calls else "")
        for m in render(paired(gap))
    )
    messages.append(Message("user", f"Conversation:\n{transcript}\n\nWrite the summary now."))
    try:
        text = await _complete(ctx, state, messages)
    except ModelError as exc:
        log.warning("turn %s: summary failed, going on without it: %s", ctx.turn_id, exc)
        return None
    if not text.strip():
        return None
    upto = first_kept_seq - 1
    [stored] = await ctx.sink.commit(
        [NewItem("summary", text.strip(), meta={"upto_seq": upto, "items": len(gap)})]
    )
    ctx.sink.emit(
        CONTEXT_COMPACTED,
        {"summary_seq": stored.seq, "upto_seq": upto, "summarised_items": len(gap)},
    )
    return stored


async def _complete(ctx: TurnContext, state: TurnState, messages: list[Message]) -> str:
    request = ModelRequest(
        messages=tuple(messages), max_output_tokens=SUMMARY_TOKENS, temperature=0.0
    )
    parts: list[str] = []
    async for event in ctx.model.stream(request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, ModelUsage):
            state.add_usage(event.input_tokens, event.output_tokens)
    return "".join(parts)


def summary_tokens(item: Item | None) -> int:
    return estimate_tokens(item.content) + 16 if item is not None else 0
