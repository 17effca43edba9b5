"""With no configuration at all, an agent answers from the embedded local model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import Agent
from tether.models import resolve_model
from tether.models.local import LocalModel


@pytest.fixture
def fresh_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.delenv("TETHER_MODEL", raising=False)
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def test_default_model_is_the_embedded_one(fresh_env: Path) -> None:
    assert isinstance(resolve_model(None), LocalModel)


@pytest.mark.real_model
@pytest.mark.slow
def test_default_agent_answers_and_persists(fresh_env: Path) -> None:
    agent = Agent(
        name="Assistant",
        instructions="You are a helpful assistant.",
        memory={"session_id": "first-run"},
    )
    reply = agent.start("What is the capital of France? Answer in one sentence.")
    assert "Paris" in reply
    assert (fresh_env / "tether.db").is_file()
