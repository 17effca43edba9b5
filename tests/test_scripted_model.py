"""ScriptedModel: the script, then ``default``, then ScriptExhausted; never a made-up answer."""

from __future__ import annotations

import pytest

from tests.helpers import running
from tether import Agent, TurnFailed
from tether.errors import ModelError, ScriptExhausted
from tether.models.base import Message, ModelRequest, TextDelta
from tether.store.protocol import Store
from tether.testing import Call, EchoModel, ScriptedModel, ToolCalls, reply_to


def request(text: str = "hi") -> ModelRequest:
    return ModelRequest((Message("system", "be brief"), Message("user", text)))


async def answer(model: ScriptedModel, text: str = "hi") -> str:
    """The text one call streams back."""
    return "".join([e.text async for e in model.stream(request(text)) if isinstance(e, TextDelta)])


async def test_a_call_past_the_script_raises_script_exhausted() -> None:
    model = ScriptedModel("the only answer", name="tiny")
    assert await answer(model) == "the only answer"
    with pytest.raises(ScriptExhausted) as info:
        await answer(model, "one more")
    error = info.value
    assert isinstance(error, ModelError)
    assert error.transient is False  # the loop fails the turn at once instead of retrying
    message = str(error)
    assert "'tiny'" in message
    assert "call 2" in message
    assert "script had 1 response;" in message
    assert "default=" in message
    # The extra call is still recorded, so a test can see what asked for it.
    assert [r.messages[-1].content for r in model.requests] == ["hi", "one more"]


async def test_an_empty_script_raises_at_the_first_call() -> None:
    model = ScriptedModel()
    with pytest.raises(ScriptExhausted, match="script had 0 responses"):
        await answer(model)


async def test_responses_scripted_later_count_and_answer() -> None:
    model = ScriptedModel("one")
    model.script("two", ToolCalls(Call("lookup", {"q": 1})))
    assert await answer(model) == "one"
    assert await answer(model) == "two"
    assert await answer(model) == ""  # the tool call step streams no text
    with pytest.raises(ScriptExhausted, match="script had 3 responses"):
        await answer(model)
    model.script("four")
    assert await answer(model) == "four"


async def test_default_answers_every_further_call() -> None:
    fixed = ScriptedModel("scripted", default="fallback")
    assert [await answer(fixed) for _ in range(4)] == ["scripted"] + ["fallback"] * 3

    responder = ScriptedModel(default=reply_to)
    assert await answer(responder, "first") == "reply to: first"
    assert await answer(responder, "second") == "reply to: second"
    assert len(responder.requests) == 2

    echo = EchoModel()
    assert await answer(echo, "ping") == "user:ping"  # system messages are left out
    assert await answer(echo, "again") == "user:again"


async def test_a_turn_on_an_exhausted_model_fails_with_model_error(store: Store) -> None:
    model = ScriptedModel("first answer")
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        assert await rt.chat(agent, "one", session_id="s") == "first answer"
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "two", session_id="s")
        turn = info.value.turn
        assert (turn.status, turn.reason) == ("failed", "model_error")
        assert turn.error is not None and "script had 1 response" in turn.error
        stored = await rt.store.get_turn(turn.key, turn.id)
        assert stored is not None and (stored.status, stored.reason) == ("failed", "model_error")
    assert len(model.requests) == 2  # not transient: the failing call was not retried
