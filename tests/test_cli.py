"""The ``tether`` command's local subcommands, run in-process with typer's runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import Agent
from tether.app import load_agents
from tether.cli import app
from tether.errors import ConfigError
from tether.runtime import Runtime
from tether.server.settings import Settings
from tether.store import SQLiteStore
from tether.testing import EchoModel

runner = CliRunner()


def _seed(data_dir: Path) -> None:
    agent = Agent(name="echo", model=EchoModel())

    async def go() -> None:
        async with Runtime(
            SQLiteStore(data_dir / "tether.db"), data_dir=data_dir, agents=[agent]
        ) as rt:
            await rt.chat(agent, "hello there", session_id="kept")
            await rt.chat(agent, "bye", session_id="doomed")

    asyncio.run(go())


def test_sessions_list_show_delete_on_the_local_store(tmp_path: Path) -> None:
    _seed(tmp_path)
    listed = runner.invoke(app, ["sessions", "list", "--data-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "kept" in listed.output and "doomed" in listed.output
    shown = runner.invoke(app, ["sessions", "show", "kept", "--data-dir", str(tmp_path)])
    assert shown.exit_code == 0
    assert "hello there" in shown.output and "user:hello there" in shown.output
    deleted = runner.invoke(app, ["sessions", "delete", "doomed", "--data-dir", str(tmp_path)])
    assert deleted.exit_code == 0
    again = runner.invoke(app, ["sessions", "list", "--data-dir", str(tmp_path)])
    assert "doomed" not in again.output and "kept" in again.output
    missing = runner.invoke(app, ["sessions", "show", "nope", "--data-dir", str(tmp_path)])
    assert missing.exit_code != 0 and "nope" in missing.output


def test_db_upgrade_creates_the_schema(tmp_path: Path) -> None:
    result = runner.invoke(app, ["db", "upgrade", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0 and "up to date" in result.output
    assert (tmp_path / "tether.db").is_file()


def test_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TETHER_HOST", "0.0.0.0")
    monkeypatch.setenv("TETHER_PORT", "9001")
    monkeypatch.setenv("TETHER_MODEL", "ollama:llama3.2")
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("TETHER_STORE", str(tmp_path / "env.db"))
    from_env = Settings.from_env()
    assert (from_env.host, from_env.port, from_env.model) == ("0.0.0.0", 9001, "ollama:llama3.2")
    assert from_env.store_url == str(tmp_path / "env.db")
    assert not from_env.loopback
    flagged = Settings.from_env(
        host="127.0.0.1", port=8080, model="local", data_dir=tmp_path / "flag", store=None
    )
    assert (flagged.host, flagged.port, flagged.model) == ("127.0.0.1", 8080, "local")
    assert flagged.data_dir == tmp_path / "flag" and flagged.loopback
    monkeypatch.setenv("TETHER_PORT", "eighty")
    with pytest.raises(ConfigError):
        Settings.from_env()


def test_agents_from_yaml(tmp_path: Path) -> None:
    spec = tmp_path / "agents.yaml"
    spec.write_text(
        "agents:\n"
        "  - name: support\n"
        "    instructions: You answer questions about our product.\n"
        "    model: openai:gpt-4o-mini\n"
        "    max_iterations: 4\n"
        "  - name: writer\n"
        "    role: Copywriter\n"
        "    goal: Write short taglines\n"
    )
    support, writer = load_agents(str(spec))
    assert support.model == "openai:gpt-4o-mini" and support.max_iterations == 4
    assert writer.instructions == "Role: Copywriter\nGoal: Write short taglines"
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents:\n  - name: x\n    temprature: 0.2\n")
    with pytest.raises(ConfigError, match="temprature"):
        load_agents(str(bad))
    with pytest.raises(ConfigError):
        load_agents(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError):
        load_agents("no_such_module_here:app")
