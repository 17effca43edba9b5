"""A model that cannot run is a failed turn that says why, and a server says so when it starts;
a reply cut at the output cap is kept and flagged, never passed off as whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.helpers import key, running
from tether import Agent, TurnFailed
from tether.app import model_problems
from tether.models.base import Finish, ModelEvent, ModelRequest, TextDelta, Usage
from tether.store import InMemoryStore
from tether.testing import ScriptedModel


async def test_a_model_without_its_api_key_fails_the_turn_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    agent = Agent(name="a", model="openai:gpt-no-key-here")
    async with running(InMemoryStore(), agent) as rt:
        with pytest.raises(TurnFailed) as failed:
            await rt.chat(agent, "hi", session_id="s")
        turn = failed.value.turn
        assert (turn.status, turn.reason) == ("failed", "model_error")
        assert turn.error is not None and "API key" in turn.error
        # The session is fine: it was the model, not a lost process.
        assert [t.reason for t in await rt.store.list_turns(key("s"))] == ["model_error"]


def test_a_server_names_the_agents_whose_model_cannot_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    agents = [
        Agent(name="fine", model="local"),
        Agent(name="keyless", model="openai:gpt-still-no-key"),
        Agent(name="unknown", model="nowhere:model"),
    ]
    problems = model_problems(agents, None)
    assert len(problems) == 2
    assert problems[0].startswith("agent keyless:") and "API key" in problems[0]
    assert problems[1].startswith("agent unknown:")


class CutModel:
    """Streams a reply and stops at its cap (finish reason ``length``)."""

    name = "cut"
    context_window = 4096

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        yield TextDelta("Once upon a time there was a")
        yield Usage(5, 7)
        yield Finish("length")


async def test_a_reply_cut_at_the_output_cap_is_kept_and_flagged() -> None:
    agent = Agent(name="teller", model=CutModel())
    async with running(InMemoryStore(), agent) as rt:
        reply = await rt.chat(agent, "tell me a story", session_id="s")
        assert reply == "Once upon a time there was a"
        assert reply.complete is False  # the reply itself says so, not only its turn
        [turn] = await rt.store.list_turns(key("s"))
        assert (turn.status, turn.reason, turn.complete) == (
            "completed",
            "max_output_tokens",
            False,
        )
        items = await rt.store.list_items(key("s"))
        assert [(i.kind, i.complete) for i in items] == [("user", True), ("assistant", False)]


async def test_a_fault_setting_a_turn_up_ends_it_at_once_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not as ``owner_lost`` once the lease ran out (15 s and more), as if its process had
    died: the process is alive, and the session's next turn runs."""
    from tether.scheduler.runner import TurnRunner as Runner

    real = Runner._builtin_tools
    broken = {"yes": True}

    def builtin_tools(self: Runner, *args: object, **kwargs: object) -> object:
        if broken["yes"]:
            raise TypeError("unsupported operand type(s)")
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Runner, "_builtin_tools", builtin_tools)
    agent = Agent(name="a", model=ScriptedModel(default="fine"))
    async with running(InMemoryStore(), agent) as rt:
        with pytest.raises(TurnFailed) as failed:
            await asyncio.wait_for(rt.chat(agent, "hi", session_id="s"), 5)
        turn = failed.value.turn
        assert (turn.status, turn.reason) == ("failed", "internal_error")
        # A message of ours naming the kind of fault, not the exception's text (DESIGN §11).
        assert turn.error is not None and "TypeError" in turn.error
        assert "unsupported" not in turn.error
        broken["yes"] = False
        assert await asyncio.wait_for(rt.chat(agent, "again", session_id="s"), 5) == "fine"
        assert [t.reason for t in await rt.store.list_turns(key("s"))] == [
            "internal_error",
            "answered",
        ]


class BrokenModel:
    """A model object of the app's that breaks with internals in its exception's text."""

    name = "broken"
    context_window = 4096

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        if request.messages:
            raise RuntimeError("cannot open /srv/secret/config.yaml")
        yield TextDelta("")


async def test_an_internal_fault_is_said_in_words_of_ours() -> None:
    """DESIGN §11: a turn's ``error`` is a short message of ours, never an exception's text
    (that goes to the log)."""
    agent = Agent(name="a", model=BrokenModel())
    async with running(InMemoryStore(), agent) as rt:
        with pytest.raises(TurnFailed) as failed:
            await rt.chat(agent, "hi", session_id="s")
    turn = failed.value.turn
    assert (turn.status, turn.reason) == ("failed", "internal_error")
    assert turn.error is not None and "RuntimeError" in turn.error
    assert "secret" not in turn.error
    # A sentence a caller can act on (the log), not the bare name of a Python class.
    assert "internal error" in turn.error and "log" in turn.error
