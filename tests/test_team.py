"""``Task`` and ``AgentTeam`` (PraisonAI's sequential process): each task is a turn of its agent
on the team's one session, given the outputs it depends on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import Agent, AgentTeam, ConfigError, Session, Task, TurnFailed
from tether.models.base import ModelRequest
from tether.testing import Fail, ScriptedModel


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def says(who: str) -> ScriptedModel:
    def answer(request: ModelRequest) -> str:
        return f"{who} did: {request.messages[-1].content.splitlines()[0]}"

    return ScriptedModel(default=answer)


def test_tasks_run_in_order_each_given_the_one_before() -> None:
    researcher = Agent(name="researcher", instructions="Research.", model=says("researcher"))
    writer = Agent(name="writer", instructions="Write.", model=says("writer"))
    research = Task(action="Find three facts", expected_output="A list", agent=researcher)
    write = Task(name="write", action="Write a paragraph", agent=writer)
    team = AgentTeam(agents=[researcher, writer], tasks=[research, write])
    assert team.start() == "writer did: Write a paragraph"
    assert research.output == "researcher did: Find three facts"
    [request] = writer.model.requests  # type: ignore[union-attr]
    prompt = request.messages[-1].content
    assert "Result of the earlier task 'Find three facts':\nresearcher did: Find three facts" in (
        prompt
    )
    assert request.messages[0].content == "Write."
    # One conversation: the writer's turn has the researcher's exchange in its history.
    assert [m.role for m in request.messages] == ["system", "user", "assistant", "user"]
    history = Session(session_id=team.session_id, user_id="local").get_context()["messages"]
    assert [m.get("agent") for m in history if m["role"] == "assistant"] == [
        "researcher",
        "writer",
    ]


def test_context_names_the_tasks_a_task_is_given() -> None:
    a = Agent(name="a", model=says("a"))
    first, second = Task(action="one", agent=a), Task(action="two", agent=a)
    third = Task(action="three", agent=a, context=[first])
    AgentTeam(agents=[a], tasks=[first, second, third]).start()
    prompt = a.model.requests[-1].messages[-1].content  # type: ignore[union-attr]
    assert "a did: one" in prompt and "a did: two" not in prompt


def test_without_tasks_each_agent_takes_the_message() -> None:
    a, b = Agent(name="a", model=says("a")), Agent(name="b", model=says("b"))
    assert AgentTeam(agents=[a, b]).start("Plan a trip") == "b did: Plan a trip"


def test_a_failed_task_stops_the_team() -> None:
    broken = Agent(name="broken", model=ScriptedModel(Fail("down", transient=False)))
    after = Agent(name="after", model=says("after"))
    team = AgentTeam(
        agents=[broken, after],
        tasks=[Task(action="x", agent=broken), Task(action="y", agent=after)],
    )
    with pytest.raises(TurnFailed):
        team.start()
    assert after.model.requests == []  # type: ignore[union-attr]


async def test_astart_runs_from_async_code() -> None:
    a = Agent(name="a", model=says("a"))
    assert await AgentTeam(agents=[a], tasks=[Task(description="old name", agent=a)]).astart() == (
        "a did: old name"
    )


def test_bad_teams_are_refused() -> None:
    a = Agent(name="a")
    with pytest.raises(ConfigError, match="sequence"):
        AgentTeam(agents=[a], process="parallel")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        AgentTeam(agents=[])
    with pytest.raises(ConfigError):
        Task()


def test_a_team_is_checked_when_it_is_made() -> None:
    a, b = Agent(name="a"), Agent(name="b")
    first = Task(action="one", agent=a)
    with pytest.raises(ConfigError, match="agent"):
        Task(action="x", agent="researcher")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="context"):
        Task(action="x", context="prev")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="Task objects"):
        AgentTeam(agents=[a], tasks=["do it"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="twice"):
        AgentTeam(agents=[a], tasks=[first, first])
    with pytest.raises(ConfigError, match="not one of the team"):
        AgentTeam(agents=[a], tasks=[Task(action="x", agent=b)])
    later = Task(action="later", agent=a)
    with pytest.raises(ConfigError, match="before it"):
        AgentTeam(agents=[a], tasks=[Task(action="x", agent=a, context=[later]), later])
    with pytest.raises(tether.InvalidSessionId):
        AgentTeam(agents=[a], session_id="no spaces allowed")


def test_each_run_has_its_own_outputs_and_a_start_message_leads() -> None:
    a = Agent(name="a", model=says("a"))
    one, two = Task(action="one", agent=a), Task(action="two", agent=a)
    team = AgentTeam(agents=[a], tasks=[one, two])
    team.start()
    assert two.output == "a did: two"
    team.start("Plan a trip")
    # The message heads the first task's prompt; the second is given this run's first output.
    prompts = [r.messages[-1].content for r in a.model.requests]  # type: ignore[union-attr]
    assert prompts[2].startswith("Plan a trip\n\none")
    assert "a did: Plan a trip" in prompts[3]
