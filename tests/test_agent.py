"""The agent template is frozen, validated and safe to share."""

from __future__ import annotations

import dataclasses

import pytest

from tether import Agent, ConfigError, InvalidSessionId, tool


@tool
def noop() -> str:
    """Do nothing."""
    return ""


def test_agent_is_frozen_and_shares_nothing_mutable() -> None:
    agent = Agent(name="a", tools=[noop], memory={"session_id": "s-1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.instructions = "changed"  # type: ignore[misc]
    assert isinstance(agent.tools, tuple)
    assert agent.memory.session_id == "s-1" and agent.session_id == "s-1"
    assert agent.tool_named("noop") is noop


def test_agent_validation() -> None:
    with pytest.raises(ConfigError):
        Agent(name="")
    with pytest.raises(ConfigError):
        Agent(name="a", tools=[lambda: None])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        Agent(name="a", tools=[noop, noop])
    with pytest.raises(ConfigError):
        Agent(name="a", memory={"sesion_id": "typo"})
    with pytest.raises(InvalidSessionId):
        Agent(name="a", memory={"session_id": "has space"})
    for dots in (".", ".."):  # no URL keeps them as a path segment: never reachable remotely
        with pytest.raises(InvalidSessionId):
            Agent(name="a", memory={"session_id": dots})
    with pytest.raises(ConfigError):
        Agent(name="a", max_iterations=0)
    # A model that is neither a spec nor a model object, memory that is no policy: said so
    # (an AttributeError, and "unknown memory options: e, s, y", before).
    with pytest.raises(ConfigError, match="model is a spec"):
        Agent(name="a", model=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="memory is True, False"):
        Agent(name="a", memory="yes")  # type: ignore[arg-type]


def test_each_agent_object_has_its_own_default_session() -> None:
    assert Agent(name="a").session_id != Agent(name="a").session_id
