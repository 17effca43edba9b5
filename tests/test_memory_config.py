"""PraisonAI's memory options (issue 12): ``MemoryConfig(auto_save=…, history=…, user_id=…)``,
the same in dict form, and ``Agent(auto_save=…)`` still working with a DeprecationWarning."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import Agent, ConfigError, InvalidSessionId, MemoryConfig, MemoryPolicy
from tether.testing import EchoModel


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def test_memory_config_is_a_memory_policy() -> None:
    config = MemoryConfig(auto_save="support-chat", user_id="u-7", remember=True)
    assert isinstance(config, MemoryPolicy)
    assert (config.session_id, config.user_id, config.remember, config.history) == (
        "support-chat",
        "u-7",
        True,
        True,
    )
    assert MemoryPolicy.coerce({"auto_save": "s", "history": False}) == MemoryConfig(
        auto_save="s", history=False
    )
    with pytest.raises(ConfigError):
        MemoryConfig(auto_save="a", session_id="b")
    with pytest.raises(InvalidSessionId):
        MemoryConfig(auto_save="not a valid id!")
    with pytest.raises(ConfigError, match="unknown memory options"):
        MemoryConfig(histroy=False)


def test_auto_save_resumes_the_conversation(data_dir: Path) -> None:
    model = EchoModel()
    first = Agent(name="a", model=model, memory=MemoryConfig(auto_save="kept", user_id="u"))
    assert first.chat("hello") == "user:hello"
    # Another Agent object (a new process would be the same: the store is on disk) resumes it.
    again = Agent(name="a", model=model, memory={"auto_save": "kept", "user_id": "u"})
    assert again.chat("again") == "user:hello | assistant:user:hello | user:again"


def test_history_false_answers_each_message_on_its_own(data_dir: Path) -> None:
    model = EchoModel()
    agent = Agent(name="a", model=model, memory=MemoryConfig(auto_save="alone", history=False))
    assert agent.chat("one") == "user:one"
    assert agent.chat("two") == "user:two"  # the first exchange is not sent again
    kept = Agent(name="b", model=EchoModel(), memory=MemoryConfig(auto_save="alone"))
    assert kept.chat("three").startswith("user:one")  # but it was kept


def test_agent_auto_save_still_works_with_a_warning(data_dir: Path) -> None:
    with pytest.warns(DeprecationWarning, match="MemoryConfig"):
        agent = Agent(name="a", model=EchoModel(), auto_save="old-style")
    assert agent.memory.session_id == "old-style"
    assert agent.chat("hi") == "user:hi"
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError):
        Agent(name="a", auto_save="x", memory={"session_id": "y"})
