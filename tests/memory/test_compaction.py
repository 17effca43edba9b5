"""Long conversations: a 5,000-item session keeps its prompt in budget, summarised, nothing lost."""

from __future__ import annotations

from tests.helpers import all_items, assert_paired, running
from tether import Agent
from tether.loop import compact
from tether.loop.prepare import DEFAULT_OUTPUT_RESERVE
from tether.loop.window import estimate_tokens
from tether.models.base import ModelRequest
from tether.records import LOCAL_PRINCIPAL, NewEvent, NewItem, SessionKey, TurnEnding, new_turn_id
from tether.store.protocol import Store
from tether.testing import ScriptedModel

WINDOW = 1_500
KEY = SessionKey(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user, "long")


def reply(request: ModelRequest) -> str:
    if request.messages[0].content == compact.PROMPT:
        dropped = request.messages[-1].content.count("\nuser: ") + 1
        return f"SUMMARY covering {dropped} user messages; the user is called Zed."
    return "noted"


async def prefill(store: Store, items: int) -> None:
    """``items`` history items as completed turns of user, tool call, tool result, reply."""
    await store.create_session(KEY, "long", exist_ok=True)
    lease = await store.acquire_lease(KEY, "prefill", 600.0)
    assert lease is not None
    for n in range(items // 4):
        turn_id = new_turn_id()
        question = f"question {n}: what is {n} squared, and why does it matter here?"
        await store.enqueue_turn(KEY, turn_id=turn_id, input=question, policy="enqueue")
        await store.start_turn(lease, turn_id, [NewItem("user", question)], [])
        call = f"call_{n}"
        await store.append(
            lease,
            turn_id,
            [
                NewItem(
                    "tool_call",
                    "",
                    call_id=call,
                    tool_name="square",
                    arguments=f'{{"x": {n}}}',
                    meta={"step": 1},
                ),
                NewItem(
                    "tool_result", str(n * n), call_id=call, tool_name="square", meta={"step": 1}
                ),
            ],
            [NewEvent(2, "tool.call", {"call_id": call})],
        )
        answer = f"{n} squared is {n * n}."
        await store.end_turn(
            lease,
            turn_id,
            TurnEnding("completed", "answered", answer, True),
            [NewItem("assistant", answer, meta={"step": 2})],
            [],
        )
    await store.release_lease(lease)


def prompt_tokens(request: ModelRequest) -> int:
    return sum(
        estimate_tokens(m.content) + sum(estimate_tokens(c.arguments) for c in m.tool_calls)
        for m in request.messages
    )


def assert_prompt_pairs(request: ModelRequest) -> None:
    called = [c.id for m in request.messages for c in m.tool_calls]
    answered = [m.tool_call_id for m in request.messages if m.role == "tool"]
    assert sorted(called) == sorted(a or "" for a in answered)


async def test_five_thousand_items_stay_in_budget_summarised_and_all_kept(store: Store) -> None:
    model = ScriptedModel(default=reply, context_window=WINDOW)
    agent = Agent(name="long", model=model, memory={"auto": False, "scopes": []})
    await store.open()
    try:
        await prefill(store, 5_000)
    finally:
        await store.close()
    async with running(store, agent) as rt:
        await rt.chat(agent, "and now?", session_id="long")
        first = [r for r in model.requests if r.messages[0].content != compact.PROMPT]
        summaries = [r for r in model.requests if r.messages[0].content == compact.PROMPT]
        assert len(summaries) == 1  # one model call summarised the fallen-out slice
        [request] = first
        assert prompt_tokens(request) <= WINDOW - DEFAULT_OUTPUT_RESERVE
        assert_prompt_pairs(request)
        # The summary goes right after the instructions, before the window.
        assert request.messages[1].role == "system"
        assert "SUMMARY covering" in request.messages[1].content
        assert request.messages[-1].content == "and now?"

        items = await all_items(rt, KEY)
        raw = [i for i in items if i.kind != "summary"]
        assert len(raw) == 5_000 + 2  # nothing deleted: all prefilled items, the new question
        assert_paired(raw)  # and reply
        [summary] = [i for i in items if i.kind == "summary"]
        turns = await rt.store.list_turns(KEY, limit=2000)
        events = await rt.store.list_events(KEY, turns[-1].id)
        [compacted] = [e for e in events if e.type == "context.compacted"]
        assert compacted.data["summary_seq"] == summary.seq
        assert compacted.data["upto_seq"] == summary.meta["upto_seq"]
        # Everything after the summary's coverage is what the window holds.
        window_seqs = {i.seq for i in raw if i.seq > summary.meta["upto_seq"]}
        assert len(window_seqs) > 4

        # The next turns reuse the summary until enough new items have fallen out.
        await rt.chat(agent, "again?", session_id="long")
        assert len([r for r in model.requests if r.messages[0].content == compact.PROMPT]) == 1
        last = model.requests[-1]
        assert "SUMMARY covering" in last.messages[1].content
        assert prompt_tokens(last) <= WINDOW - DEFAULT_OUTPUT_RESERVE
        assert_prompt_pairs(last)
        for n in range(6):
            await rt.chat(agent, f"more {n}?", session_id="long")
        assert len([r for r in model.requests if r.messages[0].content == compact.PROMPT]) == 2

        # Clearing the history clears its summaries too.
        await rt.store.clear_items(KEY)
        assert await rt.store.latest_summary(KEY) is None
