"""Who keeps automatic notes (DESIGN §8): the embedded model by default, any agent that asks,
none when the server says off."""

from __future__ import annotations

import pytest

from tests.helpers import running
from tether import Agent, ConfigError
from tether.records import Namespace, SessionKey
from tether.runtime import Runtime
from tether.scheduler.runner import notes_wanted
from tether.store import InMemoryStore
from tether.store.protocol import Store
from tether.testing import ScriptedModel

SAID = "My name is Zebulon. I live in Lyon."


async def _notes(rt: Runtime, agent: Agent) -> list[str]:
    await rt.chat(agent, SAID, session_id="s")
    ns = [Namespace.session(SessionKey("local", "local", "s")), Namespace.user("local", "local")]
    return [m.content for m in await rt.store.list_memory(ns)]


async def test_a_real_model_keeps_no_notes_unless_its_agent_asks(store: Store) -> None:
    plain = Agent(name="plain", model=ScriptedModel(default="ok"))
    async with running(store, plain) as rt:
        assert await _notes(rt, plain) == []
    asks = Agent(name="asks", model=ScriptedModel(default="ok"), memory={"auto": True})
    async with running(InMemoryStore(), asks) as rt:
        assert await _notes(rt, asks) == [
            "The user's name is Zebulon.",
            'The user said: "I live in Lyon".',
        ]


async def test_the_embedded_model_keeps_notes_by_default() -> None:
    # A stand-in named like the embedded model: the default follows the model, not the agent.
    agent = Agent(name="small", model=ScriptedModel(default="ok", name="local:smollm2"))
    async with running(InMemoryStore(), agent) as rt:
        assert "The user's name is Zebulon." in await _notes(rt, agent)


async def test_the_server_can_switch_notes_off_for_every_agent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TETHER_AUTO_NOTES", "off")
    agent = Agent(name="asks", model=ScriptedModel(default="ok"), memory={"auto": True})
    rt = Runtime(InMemoryStore(), agents=[agent])
    async with rt:
        assert await _notes(rt, agent) == []
    monkeypatch.setenv("TETHER_AUTO_NOTES", "sometimes")
    with pytest.raises(ConfigError, match="TETHER_AUTO_NOTES"):
        Runtime(InMemoryStore())


@pytest.mark.parametrize(
    ("mode", "agent_says", "model", "wanted"),
    [
        ("default", None, "local:smollm2-135m-instruct", True),
        ("default", None, "openai:gpt-4o-mini", False),
        ("default", True, "openai:gpt-4o-mini", True),
        ("default", False, "local:smollm2-135m-instruct", False),
        ("on", None, "openai:gpt-4o-mini", True),
        ("on", False, "openai:gpt-4o-mini", False),
        ("off", True, "local:smollm2-135m-instruct", False),
    ],
)
def test_who_keeps_notes(mode: str, agent_says: bool | None, model: str, wanted: bool) -> None:
    assert notes_wanted(mode, agent_says, model) is wanted  # type: ignore[arg-type]
