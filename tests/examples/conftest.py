"""What every seed example runs against: the fake OpenAI server, as the process's default model.

The snippets name no model, so they run on the default one: ``TETHER_MODEL`` names a model of
the fake server (``OPENAI_BASE_URL``), in this process and in every process a test starts. The
fake answers as :func:`reader` does, so a reply says what the model was shown, and every request
it received can be read back (``fake.chat_requests``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tether.embedded
from tests.server.conftest import PYTHONPATH
from tether.testing.fake_openai import FakeOpenAIServer, FakeReply

_NAME = re.compile(r"\bname is ([A-Z][A-Za-z]+)")


def reader(body: dict[str, Any]) -> FakeReply:
    """A model that answers from what it is sent: asked the user's name, the latest name it
    finds in the prompt (instructions, recalled memory, history), else that it does not know;
    anything else is echoed."""
    messages = body["messages"]
    last = str(messages[-1].get("content") or "")
    if "my name" in last.lower() and last.rstrip().endswith("?"):
        for message in reversed(messages[:-1]):
            found = _NAME.findall(str(message.get("content") or ""))
            if found:
                return f"Your name is {found[-1]}."
        return "I do not know your name."
    return f"echo: {last}"


def said(request: dict[str, Any]) -> list[tuple[str, str]]:
    """A chat request's messages as ``(role, content)`` pairs."""
    return [(m["role"], str(m.get("content") or "")) for m in request["messages"]]


@dataclass
class Seed:
    """The environment of one example: its fake model, its data directory and working
    directory (``tmp_path``: the snippets name files relative to it), and the variables a
    process it starts needs to reach the same model and store."""

    fake: FakeOpenAIServer
    cwd: Path
    env: dict[str, str]

    def run(self, code: str, *args: str, timeout: float = 60) -> str:
        """Run ``code`` as a script of its own process (as a user would); its stdout."""
        script = self.cwd / f"snippet_{len(list(self.cwd.glob('snippet_*.py')))}.py"
        script.write_text(textwrap.dedent(code))
        done = subprocess.run(
            [sys.executable, str(script), *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def restart(self) -> None:
        """End this process's embedded runtime, as the end of a script does: the next call
        starts a new one on the same store."""
        tether.embedded.shutdown()


def model_env_of(fake: FakeOpenAIServer) -> dict[str, str]:
    """What a process needs to run agents that name no model on ``fake``."""
    # A model spec of this fake server's own: a process keeps one model per spec, made with the
    # OPENAI_BASE_URL of its first use, and an earlier module's fake has another port.
    return {
        "TETHER_MODEL": f"openai:seed-examples-{fake.port}",
        "OPENAI_BASE_URL": fake.base_url,
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
    }


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(reply=reader) as srv:
        yield srv


@pytest.fixture
def seed(fake: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seed]:
    fake.reset()
    fake.latency_ms = 0
    model_env = model_env_of(fake)
    data = tmp_path / "data"
    for name, value in {**model_env, "TETHER_DATA_DIR": str(data)}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TETHER_AUTO_NOTES", raising=False)
    monkeypatch.chdir(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": PYTHONPATH,
        "TETHER_DATA_DIR": str(data),
        **model_env,
    }
    made = Seed(fake, tmp_path, env)
    yield made
    made.restart()


__all__ = ["Seed", "model_env_of", "reader", "said"]
