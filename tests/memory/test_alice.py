"""The documented Sessions quick start, on the embedded model, in two separate processes.

The agent is configured exactly as the README shows it: the defaults (automatic notes, recall
into the system prompt) are what make the small model answer from memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def run(tmp_path: Path, code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_MODEL"}
    env["TETHER_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_my_name_is_alice_across_two_processes(tmp_path: Path) -> None:
    agent = """
        from tether import Agent
        agent = Agent(name="Assistant", instructions="You are a helpful assistant",
                      memory={"session_id": "my-session-123"})
        print(agent.start(%r))
    """
    run(tmp_path, agent % "My name is Alice")
    reply = run(tmp_path, agent % "What's my name?")
    assert "Alice" in reply, reply


def test_user_memory_carries_the_name_to_another_session(tmp_path: Path) -> None:
    agent = """
        from tether import Agent
        agent = Agent(name="Assistant", instructions="You are a helpful assistant",
                      memory={"session_id": %r, "user_id": "u-17", "scopes": ["session", "user"]})
        print(agent.start(%r))
    """
    run(tmp_path, agent % ("first-chat", "My name is Alice"))
    reply = run(tmp_path, agent % ("second-chat", "What's my name?"))
    assert "Alice" in reply, reply
