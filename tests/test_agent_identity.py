"""A turn runs exactly the agent it was submitted for (DESIGN §2, §11).

The models here answer with the first line of their system prompt, so each reply says whose
instructions the turn really ran: a shared echo model could not tell two agents apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tests.helpers import key, running
from tether import Agent, ConfigError, Session, TurnFailed, tool
from tether.models.base import ModelRequest
from tether.records import AgentRef
from tether.store.protocol import Store
from tether.testing import ScriptedModel


def instructions(request: ModelRequest) -> str:
    return request.messages[0].content.splitlines()[0]


def speaker() -> ScriptedModel:
    return ScriptedModel(default=instructions)


async def test_two_agents_in_one_session_each_run_their_own_template(store: Store) -> None:
    researcher = Agent(name="researcher", instructions="You research topics.", model=speaker())
    writer = Agent(name="writer", instructions="You write articles.", model=speaker())
    async with running(store, researcher, writer) as rt:
        assert await rt.chat(researcher, "find", session_id="s") == "You research topics."
        assert await rt.chat(writer, "draft", session_id="s") == "You write articles."
        assert await rt.chat(researcher, "more", session_id="s") == "You research topics."
        turns = await rt.store.list_turns(key("s"))
        assert [t.agent for t in turns] == [researcher.ref, writer.ref, researcher.ref]
        # One conversation: the writer saw the researcher's turn, in order.
        items = await rt.store.list_items(key("s"), limit=100)
        assert [i.content for i in items if i.kind == "user"] == ["find", "draft", "more"]


async def test_two_definitions_of_one_name_each_run_their_own_turns(store: Store) -> None:
    first = Agent(name="Assistant", instructions="You are the first.", model=speaker())
    second = Agent(name="Assistant", instructions="You are the second.", model=speaker())
    async with running(store, first) as rt:
        rt.register(second)
        # A name alone (HTTP, served) means the first definition.
        assert rt.served("Assistant") is first
        assert await rt.chat(second, "hi", session_id="s2") == "You are the second."
        assert await rt.chat(first, "hi", session_id="s1") == "You are the first."
        # Even on one session, each turn runs the definition it was sent to.
        assert await rt.chat(second, "and you?", session_id="s1") == "You are the second."
        turns = await rt.store.list_turns(key("s1"))
        assert [t.agent for t in turns] == [first.ref, second.ref]


async def test_a_definition_told_apart_only_by_its_model_object_is_refused(store: Store) -> None:
    one = Agent(name="same", instructions="Alike.", model=speaker())
    other = Agent(name="same", instructions="Alike.", model=speaker())
    assert one.fingerprint == other.fingerprint
    async with running(store, one) as rt:
        with pytest.raises(ConfigError, match="model object"):
            rt.register(other)
        with pytest.raises(ConfigError):
            await rt.chat(other, "hi", session_id="s2")
        # Nothing was queued for the refused template, and the first still answers as itself.
        assert await rt.store.get_session(key("s2")) is None
        assert await rt.chat(one, "hi", session_id="s1") == "Alike."


async def test_the_same_definition_registers_again_as_a_no_op(store: Store) -> None:
    model = speaker()
    one = Agent(name="same", instructions="You are one.", model=model)
    again = Agent(name="same", instructions="You are one.", model=model)
    assert one.fingerprint == again.fingerprint
    async with running(store, one) as rt:
        rt.register(again)
        assert rt.agents["same"] is one
        assert await rt.chat(again, "hi", session_id="s") == "You are one."


def test_the_fingerprint_follows_the_definition_not_the_conversation() -> None:
    base = Agent(name="a", instructions="x", model="local", memory={"session_id": "s1"})
    moved = Agent(name="a", instructions="x", model="local", memory={"session_id": "s2"})
    assert base.fingerprint == moved.fingerprint
    for other in (
        Agent(name="a", instructions="y", model="local"),
        Agent(name="a", instructions="x", model="openai:gpt-4o-mini"),
        Agent(name="a", instructions="x", model="local", max_iterations=3),
        Agent(name="a", instructions="x", model="local", memory={"remember": True}),
    ):
        assert other.fingerprint != base.fingerprint
    # Two model objects of one class are two definitions in one process, whatever they print.
    assert not Agent(name="a", model=speaker()).same_definition(Agent(name="a", model=speaker()))


async def test_a_turn_for_another_definition_fails_instead_of_running(store: Store) -> None:
    # What a process started from other code would have queued under the same name.
    model = speaker()
    here = Agent(name="a", instructions="You are here.", model=model)
    async with running(store, here) as rt:
        await rt.sessions.create(key("s"), "a")
        turn = await rt.scheduler.submit(key("s"), "hi", agent=AgentRef("a", "0" * 32))
        done = await rt.scheduler.wait(turn.key, turn.id)
        assert (done.status, done.reason) == ("failed", "agent_changed")
        assert model.requests == []
        # Its items never reach a model: the next turn of this definition starts clean.
        assert await rt.chat(here, "again", session_id="s") == "You are here."
        assert [m.content for m in model.requests[0].messages if m.role == "user"] == ["again"]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def test_session_agents_take_turns_with_their_own_instructions(data_dir: Path) -> None:
    session = Session(session_id="multi", user_id="ada")
    researcher = session.Agent(
        name="researcher", instructions="You research topics.", model=speaker()
    )
    writer = session.Agent(name="writer", instructions="You write articles.", model=speaker())
    assert researcher.chat("find sources") == "You research topics."
    assert writer.chat("write it up") == "You write articles."
    assert session.chat("and now?") == "You write articles."  # the session's latest agent
    history = [m["content"] for m in session.get_context()["messages"] if m["role"] == "user"]
    assert history == ["find sources", "write it up", "and now?"]


def test_two_embedded_agents_of_one_name_each_answer_as_themselves(data_dir: Path) -> None:
    first = Agent(name="Assistant", instructions="You are the first.", model=speaker())
    second = Agent(name="Assistant", instructions="You are the second.", model=speaker())
    assert first.chat("hi") == "You are the first."
    assert second.chat("hi") == "You are the second."
    assert first.chat("again") == "You are the first."
    # Sessions with other options make other definitions of one agent name: both are served.
    closed = Session(session_id="opted-out", user_id="alice", memory=False)
    assert closed.Agent(name="helper", model=speaker(), instructions="No memory.").chat("hi") == (
        "No memory."
    )
    open_ = Session(session_id="remembers", user_id="bob")
    assert open_.Agent(name="helper", model=speaker(), instructions="Memory.").chat("hi") == (
        "Memory."
    )
    with pytest.raises(TurnFailed):
        # A failed turn still raises as before: identity checks did not swallow errors.
        Agent(name="broken", model=ScriptedModel()).chat("x")


def test_a_notebook_cell_run_again_defines_the_same_agent() -> None:
    # Running the cell again makes new function objects of the same tools: the same template.
    def cell() -> Agent:
        @tool
        def lookup(word: str) -> str:
            """Look a word up."""
            return word.upper()

        return Agent(name="nb", instructions="You look things up.", model="local", tools=[lookup])

    assert cell().same_definition(cell())

    @tool
    def lookup(word: str) -> str:
        """Look a word up."""
        return word.lower()  # same name and schema, other code: another template

    other = Agent(name="nb", instructions="You look things up.", model="local", tools=[lookup])
    assert not cell().same_definition(other)
