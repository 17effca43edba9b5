"""Handoffs (DESIGN §10): an agent passes the conversation to another one inside its session.

The targets' models answer with the first line of their system prompt and the user messages
they were shown, so every reply says whose instructions ran it and on which history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tether.embedded
from tests.helpers import all_items, assert_paired, key, running
from tether import Agent, ConfigError, Decision, Session, handoff, tool
from tether.handoff import MAX_HANDOFFS_PER_TURN
from tether.models.base import ModelRequest
from tether.store.protocol import Store
from tether.testing import Call, Fail, ScriptedModel, ToolCalls


def whose(request: ModelRequest) -> str:
    users = [m.content for m in request.messages if m.role == "user"]
    return f"{request.messages[0].content.splitlines()[0]} saw {users}"


def routes(request: ModelRequest) -> str | ToolCalls:
    """Triage: sends bills to billing and the rest to tech; answers itself after a transfer
    was refused (or when told to stay)."""
    last = request.messages[-1]
    if last.role == "tool":
        return f"triage answers: {last.content}"
    text = last.content
    if "stay" in text:
        return whose(request)
    target = "billing" if "bill" in text else "tech"
    return ToolCalls(Call(f"transfer_to_{target}", {"reason": f"about {text}"}))


def specialist(name: str, instructions: str, *, back: bool = False) -> Agent:
    def answer(request: ModelRequest) -> str | ToolCalls:
        if back and "back" in request.messages[-1].content:
            return ToolCalls(Call("transfer_to_triage", {"reason": "not mine"}))
        return whose(request)

    return Agent(
        name=name,
        instructions=instructions,
        model=ScriptedModel(default=answer),
        handoffs=["triage"] if back else None,
        description=f"{name} questions",
    )


def desk(*, back: bool = False) -> tuple[Agent, Agent, Agent]:
    billing = specialist("billing", "You billing: invoices and refunds.", back=back)
    tech = specialist("tech", "You tech: broken things.", back=back)
    triage = Agent(
        name="triage",
        instructions="You triage.",
        model=ScriptedModel(default=routes),
        handoffs=[billing, tech],
    )
    return triage, billing, tech


async def test_a_transfer_runs_the_rest_of_the_turn_as_the_target(store: Store) -> None:
    triage, billing, _ = desk()
    async with running(store, triage) as rt:
        # Serving triage serves the agents it hands to.
        assert rt.served("billing") is billing and rt.served("tech").name == "tech"
        reply = await rt.chat(triage, "my bill is wrong", session_id="s")
        assert reply == "You billing: invoices and refunds. saw ['my bill is wrong']"

        # The target's model got its own instructions, the conversation, and the transfer pair;
        # it is offered its own tools, not triage's transfer tools.
        [request] = billing.model.requests  # type: ignore[union-attr]
        assert request.messages[0].content == "You billing: invoices and refunds."
        assert [m.role for m in request.messages] == ["system", "user", "assistant", "tool"]
        assert request.messages[2].tool_calls[0].name == "transfer_to_billing"
        assert request.messages[3].content.startswith("Transferred to billing.")
        assert request.tools == ()
        # Triage was offered one transfer tool per target, described by the target.
        [asked] = triage.model.requests  # type: ignore[union-attr]
        offered = {t.name: t.description for t in asked.tools}
        assert set(offered) == {"transfer_to_billing", "transfer_to_tech"}
        assert "billing questions" in offered["transfer_to_billing"]

        items = await all_items(rt, key("s"))
        assert [i.kind for i in items] == [
            "user",
            "tool_call",
            "tool_result",
            "handoff",
            "assistant",
        ]
        assert_paired(items)
        move = items[3]
        assert move.content == "billing"
        assert (move.meta["agent"], move.meta["to"]) == ("triage", "billing")
        assert move.meta["reason"] == "about my bill is wrong"
        assert move.call_id == items[1].call_id
        assert items[1].meta["agent"] == "triage" and items[4].meta["agent"] == "billing"

        [turn] = await rt.store.list_turns(key("s"))
        assert turn.agent == triage.ref and turn.ran_by == "billing"
        events = await rt.store.list_events(key("s"), turn.id)
        [moved] = [e for e in events if e.type == "handoff"]
        assert moved.data == {
            "from": "triage",
            "to": "billing",
            "call_id": items[1].call_id,
            "reason": "about my bill is wrong",
        }


async def test_following_turns_stay_with_the_target_until_it_hands_back(store: Store) -> None:
    triage, _, _ = desk(back=True)
    async with running(store, triage) as rt:
        await rt.chat(triage, "my bill is wrong", session_id="s")
        # Sent to triage again: the conversation is billing's now, with its whole history.
        again = await rt.chat(triage, "and the second one?", session_id="s")
        assert again == (
            "You billing: invoices and refunds. saw ['my bill is wrong', 'and the second one?']"
        )
        # Billing hands back; triage answers that turn, and the next one.
        back = await rt.chat(triage, "back to the start, stay", session_id="s")
        assert back == "triage answers: Transferred to triage. triage answers from here."
        last = await rt.chat(triage, "still here? stay", session_id="s")
        assert last.startswith("You triage. saw")
        turns = await rt.store.list_turns(key("s"))
        assert [t.ran_by for t in turns] == ["billing", "billing", "triage", "triage"]
        handoffs = [i for i in await all_items(rt, key("s")) if i.kind == "handoff"]
        assert [(h.meta["agent"], h.content) for h in handoffs] == [
            ("triage", "billing"),
            ("billing", "triage"),
        ]


async def test_each_session_keeps_its_own_handoff(store: Store) -> None:
    triage, _, _ = desk()
    async with running(store, triage) as rt:
        await rt.chat(triage, "my bill", session_id="a")
        await rt.chat(triage, "my screen", session_id="b")
        assert (await rt.chat(triage, "next", session_id="a")).startswith("You billing")
        assert (await rt.chat(triage, "next", session_id="b")).startswith("You tech")
        assert (await rt.chat(triage, "stay", session_id="c")).startswith("You triage")


async def test_a_failed_turn_hands_nothing_over(store: Store) -> None:
    broken = Agent(
        name="billing",
        instructions="You billing.",
        model=ScriptedModel(Fail("down", transient=False), default=whose),
    )
    triage = Agent(
        name="triage",
        model=ScriptedModel(default=routes),
        instructions="You triage.",
        handoffs=[broken],
    )
    async with running(store, triage) as rt:
        turn = await rt.submit(triage, "my bill", session_id="s")
        done = await rt.wait_or_cancel(turn)
        assert (done.status, done.reason, done.ran_by) == ("failed", "model_error", "billing")
        # The failed turn's handoff is excluded with its items: triage has the session again.
        assert await rt.store.latest_handoff(key("s")) is None
        assert (await rt.chat(triage, "stay", session_id="s")).startswith("You triage")


async def test_calls_after_a_transfer_in_one_step_do_not_run(store: Store) -> None:
    ran: list[str] = []

    @tool
    def note(text: str) -> str:
        """Write a note."""
        ran.append(text)
        return "noted"

    billing = specialist("billing", "You billing: invoices.")
    steps = iter(
        [
            ToolCalls(
                Call("note", {"text": "before"}),
                Call("transfer_to_billing"),
                Call("note", {"text": "after"}),
            )
        ]
    )
    triage = Agent(
        name="triage",
        model=ScriptedModel(default=lambda r: next(steps)),
        tools=[note],
        handoffs=[billing],
    )
    async with running(store, triage) as rt:
        reply = await rt.chat(triage, "bill", session_id="s")
        assert reply.startswith("You billing")
        assert ran == ["before"]
        items = await all_items(rt, key("s"))
        assert_paired(items)
        results = [i.content for i in items if i.kind == "tool_result"]
        assert results[0] == "noted" and results[1].startswith("Transferred to billing")
        assert "not executed" in results[2]


async def test_a_transfer_to_an_agent_not_served_is_refused_and_the_agent_goes_on(
    store: Store,
) -> None:
    triage = Agent(name="triage", model=ScriptedModel(default=routes), handoffs=["billing"])
    async with running(store, triage) as rt:
        reply = await rt.chat(triage, "my bill", session_id="s")
        # A transfer that cannot happen is not offered (the model called it anyway).
        assert all(r.tools == () for r in triage.model.requests)  # type: ignore[union-attr]
        assert reply == (
            "triage answers: Error: the billing agent is not available; answer the user yourself."
        )
        items = await all_items(rt, key("s"))
        assert "handoff" not in [i.kind for i in items]
        [turn] = await rt.store.list_turns(key("s"))
        assert turn.ran_by == "triage"


async def test_agents_that_keep_handing_over_are_stopped(store: Store) -> None:
    ping = Agent(
        name="ping",
        model=ScriptedModel(default=lambda r: ToolCalls(Call("transfer_to_pong"))),
        handoffs=["pong"],
    )
    pong = Agent(
        name="pong",
        model=ScriptedModel(default=lambda r: ToolCalls(Call("transfer_to_ping"))),
        handoffs=[ping],
    )
    async with running(store, pong) as rt:
        turn = await rt.submit(pong, "go", session_id="s")
        done = await rt.wait_or_cancel(turn)
        assert done.status == "limit_reached"
        items = await all_items(rt, key("s"))
        assert_paired(items)
        assert sum(i.kind == "handoff" for i in items) == MAX_HANDOFFS_PER_TURN


async def test_a_handed_to_agent_parks_on_a_decision_and_goes_on_as_itself(
    store: Store,
) -> None:
    refunds: list[str] = []

    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    def billing_flow(request: ModelRequest) -> str | ToolCalls:
        if request.messages[-1].role == "tool" and "refunded" in request.messages[-1].content:
            return f"{request.messages[0].content} done: {request.messages[-1].content}"
        return ToolCalls(Call("refund", {"order": "A1"}))

    billing = Agent(
        name="billing",
        instructions="You billing.",
        model=ScriptedModel(default=billing_flow),
        tools=[refund],
        max_iterations=2,
    )
    triage = Agent(name="triage", model=ScriptedModel(default=routes), handoffs=[billing])
    asked: list[Decision] = []

    def approve(d: Decision) -> bool:
        asked.append(d)
        return True

    async with running(store, triage) as rt:
        reply = await rt.chat(triage, "refund my bill", session_id="s", on_decision=approve)
        assert reply == "You billing. done: refunded A1"
        assert refunds == ["A1"] and [d.payload["tool"] for d in asked] == ["refund"]
        [turn] = await rt.store.list_turns(key("s"))
        assert (turn.status, turn.ran_by) == ("completed", "billing")


def test_handoffs_are_checked_when_the_agent_is_made() -> None:
    billing = Agent(name="Billing Agent")
    with pytest.raises(ConfigError, match="itself"):
        Agent(name="triage", handoffs=["triage"])
    with pytest.raises(ConfigError, match="two handoffs"):
        Agent(name="triage", handoffs=[billing, "Billing Agent"])
    with pytest.raises(ConfigError, match="not an agent"):
        Agent(name="triage", handoffs=[42])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="list of agents"):
        Agent(name="triage", handoffs={"billing": billing})
    for bad in (5, None):
        with pytest.raises(ConfigError, match="agent or an agent's name"):
            handoff(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="text"):
        handoff(billing, tool_description_override=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tool name"):
        handoff(billing, tool_name_override="")

    @tool
    def transfer_to_billing_agent() -> str:
        """A tool that shadows the transfer."""
        return ""

    with pytest.raises(ConfigError, match="both named"):
        Agent(name="triage", tools=[transfer_to_billing_agent], handoffs=[billing])
    triage = Agent(
        name="triage",
        handoffs=[handoff(billing, tool_name_override="escalate", tool_description_override="Up.")],
    )
    [h] = triage.handoffs
    assert (h.tool_name, h.description, h.agent_name) == ("escalate", "Up.", "Billing Agent")
    assert Agent(name="t", handoffs=[billing]).handoffs[0].tool_name == "transfer_to_billing_agent"


def test_the_fingerprint_covers_the_handoffs() -> None:
    one, two = Agent(name="billing"), Agent(name="billing", instructions="Other.")
    assert Agent(name="t", handoffs=[one]).fingerprint != Agent(name="t").fingerprint
    assert (
        Agent(name="t", handoffs=[one]).fingerprint != Agent(name="t", handoffs=[two]).fingerprint
    )
    assert (
        Agent(name="t", handoffs=[one]).fingerprint == Agent(name="t", handoffs=[one]).fingerprint
    )


def test_a_sessions_memory_options_hold_after_its_agent_hands_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    prompts: list[str] = []

    def shows(request: ModelRequest) -> str | ToolCalls:
        prompts.append(request.messages[0].content)
        return routes(request)

    def billing_shows(request: ModelRequest) -> str:
        prompts.append(request.messages[0].content)
        return "billing here"

    billing = Agent(name="billing", model=ScriptedModel(default=billing_shows))
    try:
        session = Session(
            session_id="kx",
            user_id="u2",
            memory=False,
            knowledge={"vector_store": {"config": {"collection_name": "handbook"}}},
        )
        session.add_memory("The user's favourite colour is TEAL", scope="user")
        session.add_knowledge("PINEAPPLE is the code word of the handbook")
        triage = session.Agent(
            name="triage", model=ScriptedModel(default=shows), handoffs=[billing]
        )
        assert triage.chat("my bill about the PINEAPPLE code word") == "billing here"
        assert triage.chat("and the PINEAPPLE again?") == "billing here"
    finally:
        tether.embedded.shutdown()
    # Every prompt of both turns, billing's included: the session's knowledge, never the user
    # memory the session turned off.
    assert len(prompts) == 3
    assert all("PINEAPPLE is the code word" in p for p in prompts), prompts
    assert not any("TEAL" in p for p in prompts), prompts


async def test_a_tool_approved_for_good_runs_after_a_handoff_without_asking(
    store: Store,
) -> None:
    refunds: list[str] = []

    @tool(requires_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    def billing_flow(request: ModelRequest) -> str | ToolCalls:
        if request.messages[-1].role == "tool" and "refunded" in request.messages[-1].content:
            return "done"
        return ToolCalls(Call("refund", {"order": "B2"}))

    billing = Agent(name="billing", model=ScriptedModel(default=billing_flow), tools=[refund])
    triage = Agent(name="triage", model=ScriptedModel(default=routes), handoffs=[billing])
    asked: list[Decision] = []
    async with running(store, triage) as rt:
        await rt.ensure_session(key("s"), "triage")
        await rt.store.update_session(key("s"), state={"always_approve": ["refund"]})
        # The turn starts with triage, which has no tool that asks; billing's does, and the
        # session approved it for good: it runs, and nobody is asked.
        reply = await rt.chat(triage, "refund my bill", session_id="s", on_decision=asked.append)
        assert (reply, refunds, asked) == ("done", ["B2"], [])
