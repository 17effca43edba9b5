"""The ``tether`` command's local subcommands, run in-process with typer's runner."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tether import Agent, Principal
from tether.app import load_agents
from tether.cli import app
from tether.errors import ConfigError
from tether.records import SessionKey
from tether.runtime import Runtime
from tether.server.settings import Settings
from tether.store import SQLiteStore
from tether.testing import EchoModel
from tether.tools.workspace import ROOT_ENV, ensure_workspace, root_for, workspace_dir

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


def test_sessions_of_another_user_on_the_local_store(tmp_path: Path) -> None:
    # What a script's Session(user_id="ada") made: listed, shown and deleted with --user.
    agent = Agent(name="echo", model=EchoModel())

    async def go() -> None:
        async with Runtime(SQLiteStore(tmp_path / "tether.db"), agents=[agent]) as rt:
            await rt.chat(
                agent, "ada was here", session_id="hers", principal=Principal("local", "ada")
            )

    asyncio.run(go())
    base = ["--data-dir", str(tmp_path)]
    assert "hers" not in runner.invoke(app, ["sessions", "list", *base]).output
    listed = runner.invoke(app, ["sessions", "list", "--user", "ada", *base])
    assert listed.exit_code == 0 and "hers" in listed.output
    shown = runner.invoke(app, ["sessions", "show", "hers", "--user", "ada", *base])
    assert "ada was here" in shown.output
    deleted = runner.invoke(app, ["sessions", "delete", "hers", "--user", "ada", *base])
    assert deleted.exit_code == 0, deleted.output
    assert "hers" not in runner.invoke(app, ["sessions", "list", "--user", "ada", *base]).output


def _workspaces_with_a_file(data_dir: Path, *keys: SessionKey) -> list[Path]:
    """The sessions' workspaces, each holding a file, as a file or sandbox tool leaves them."""
    found = []
    for k in keys:
        workspace = ensure_workspace(workspace_dir(root_for(data_dir), k))
        (workspace / "notes.txt").write_text("kept here")
        found.append(workspace)
    return found


def test_sessions_delete_removes_the_sessions_workspace_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    _seed(tmp_path)
    doomed, kept = _workspaces_with_a_file(
        tmp_path, SessionKey("local", "local", "doomed"), SessionKey("local", "local", "kept")
    )
    deleted = runner.invoke(app, ["sessions", "delete", "doomed", "--data-dir", str(tmp_path)])
    assert deleted.exit_code == 0, deleted.output
    assert not doomed.exists()
    assert (kept / "notes.txt").read_text() == "kept here"


def test_forget_removes_the_users_workspaces_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    agent = Agent(name="echo", model=EchoModel())
    ada, other = Principal("local", "ada"), Principal("local", "local")

    async def go() -> None:
        async with Runtime(
            SQLiteStore(tmp_path / "tether.db"), data_dir=tmp_path, agents=[agent]
        ) as rt:
            for who in (ada, other):
                await rt.chat(agent, "hi", session_id="s", principal=who)

    asyncio.run(go())
    hers, theirs = _workspaces_with_a_file(
        tmp_path, SessionKey.of(ada, "s"), SessionKey.of(other, "s")
    )
    # No --tenant: both tenants a user has data in without saying so, "local" among them.
    forgot = runner.invoke(app, ["forget", "--user", "ada", "-y", "--data-dir", str(tmp_path)])
    assert forgot.exit_code == 0, forgot.output
    assert "local/ada: forgot 1 sessions" in forgot.output
    assert not hers.exists() and not hers.parent.exists()
    assert (theirs / "notes.txt").read_text() == "kept here"


def test_db_upgrade_says_what_it_did(tmp_path: Path) -> None:
    """It said "schema is up to date" even as it made the whole schema: an operator could not
    tell a no-op from a migration."""
    from tether.store.sqlite.migrations import MIGRATIONS

    latest = MIGRATIONS[-1][0]
    made = runner.invoke(app, ["db", "upgrade", "--data-dir", str(tmp_path)])
    assert made.exit_code == 0 and f"schema made: version {latest}" in made.output
    assert (tmp_path / "tether.db").is_file()
    again = runner.invoke(app, ["db", "upgrade", "--data-dir", str(tmp_path)])
    assert again.exit_code == 0 and f"schema is up to date: version {latest}" in again.output
    # As a file an older tether left (the latest migration, a trigger made anew, can run again).
    with sqlite3.connect(tmp_path / "tether.db") as conn:
        conn.execute("DELETE FROM schema_version WHERE version = ?", (latest,))
    upgraded = runner.invoke(app, ["db", "upgrade", "--data-dir", str(tmp_path)])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"schema upgraded: version {latest - 1} -> {latest}" in upgraded.output


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
        "    memory: {scopes: [session, user], knowledge: [handbook], remember: true}\n"
        "    on_max_iterations: ask\n"
        "    ask_user: true\n"
        "    approval_timeout: 90\n"
        "  - name: writer\n"
        "    role: Copywriter\n"
        "    goal: Write short taglines\n"
    )
    support, writer = load_agents(str(spec))
    assert support.model == "openai:gpt-4o-mini" and support.max_iterations == 4
    assert (support.on_max_iterations, support.ask_user, support.approval_timeout) == (
        "ask",
        True,
        90,
    )
    assert support.memory.scopes == ("session", "user")
    assert support.memory.knowledge == ("handbook",) and support.memory.remember
    assert writer.memory.scopes == ("session", "user", "agent", "tenant")  # the default
    assert writer.memory.note_scope == "session" and support.memory.note_scope == "user"
    assert writer.instructions == "Role: Copywriter\nGoal: Write short taglines"
    desk = tmp_path / "desk.yaml"
    desk.write_text(
        "agents:\n  - name: triage\n    handoffs: [billing]\n"
        "  - name: billing\n    handoffs: [triage]\n"
    )
    triage, billing = load_agents(str(desk))
    assert [h.tool_name for h in triage.handoffs] == ["transfer_to_billing"]
    assert [h.agent_name for h in billing.handoffs] == ["triage"]
    desk.write_text("agents:\n  - name: triage\n    handoffs: [billing]\n")
    with pytest.raises(ConfigError, match="billing"):
        load_agents(str(desk))
    bad = tmp_path / "bad.yaml"
    bad.write_text("agents:\n  - name: x\n    temprature: 0.2\n")
    with pytest.raises(ConfigError, match="temprature"):
        load_agents(str(bad))
    with pytest.raises(ConfigError):
        load_agents(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError):
        load_agents("no_such_module_here:app")


def test_a_script_is_served_by_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Before, "../myapp.py:app" was imported as a (relative) module name: a TypeError's
    # traceback. Its own folder's modules import as they would when it is run from there.
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "helpers_of_script.py").write_text("NAME = 'from-a-path'\n")
    (folder / "json.py").write_text(  # a script named like a module already imported
        "from helpers_of_script import NAME\nfrom tether import Agent\nagent = Agent(name=NAME)\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))
    [agent] = load_agents("../proj/json.py:agent")
    assert agent.name == "from-a-path"
    # It does not stand in for the module it is named like (it did: JSON broke after).
    import json

    assert sys.modules["json"] is json and json.loads("[1]") == [1]
    for bad in ("../proj/nothing.py:agent", "../proj:agent", "..app:agent"):
        with pytest.raises(ConfigError):
            load_agents(bad)


def _docs(tmp_path: Path) -> Path:
    from fpdf import FPDF

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "leave.md").write_text("# Leave\n\nStaff get 27 days of paid leave a year.\n")
    pdf = FPDF()
    pdf.add_page()
    pdf.set_font("Helvetica", size=12)
    pdf.multi_cell(0, 8, "The office parrot is called Captain Quillfeather.")
    pdf.output(str(docs / "sub" / "parrot.pdf"))
    (docs / "notes.bin").write_bytes(b"\x00\x01 not a document")  # not picked up
    return docs


def test_knowledge_add_search_and_forget_on_the_local_store(tmp_path: Path) -> None:
    data = ["--data-dir", str(tmp_path / "data")]
    added = runner.invoke(
        app, ["knowledge", "add", str(_docs(tmp_path)), "--collection", "office", *data]
    )
    assert added.exit_code == 0, added.output
    assert "added 2 of 2 documents to 'office'" in added.output
    found = runner.invoke(
        app, ["knowledge", "search", "what is the parrot called", "--collection", "office", *data]
    )
    assert found.exit_code == 0, found.output
    first = found.output.split("\n\n")[0]
    assert "parrot.pdf p.1" in first and "Quillfeather" in first

    forgot = runner.invoke(app, ["forget", "--user", "local", "--tenant", "local", "-y", *data])
    assert forgot.exit_code == 0, forgot.output
    assert "forgot 0 sessions, 2 memory items and chunks, 2 documents" in forgot.output
    gone = runner.invoke(app, ["knowledge", "search", "parrot", "--collection", "office", *data])
    assert "no passage matched" in gone.output


def test_knowledge_add_shows_a_progress_bar_in_a_terminal(tmp_path: Path) -> None:
    import sys

    import pexpect

    child = pexpect.spawn(
        sys.executable,
        [
            "-m",
            "tether",
            "knowledge",
            "add",
            str(_docs(tmp_path)),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        encoding="utf-8",
        timeout=60,
        dimensions=(24, 120),
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    screen = child.before or ""
    assert "documents" in screen and "2/2" in screen  # the bar's label and its count
    assert "━" in screen  # the bar itself


def test_knowledge_add_checks_its_options_before_reading_files(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    data = ["--data-dir", str(tmp_path / "data")]
    for args, message in (
        (["--collection", "bad name"], "collection name"),
        (["--scope", "galaxy"], "--scope must be"),
        (["--scope", "agent"], "needs --agent"),
    ):
        result = runner.invoke(app, ["knowledge", "add", str(docs), *args, *data])
        assert result.exit_code != 0 and message in result.output, result.output
        assert "skipped" not in result.output and "documents" not in result.output


def test_sessions_list_shows_expired_sessions_until_they_are_swept(tmp_path: Path) -> None:
    # The operator's view of a local store: an expired session is still there (show and delete
    # act on it), so the listing shows it too.
    async def go() -> None:
        store = SQLiteStore(tmp_path / "tether.db")
        await store.open()
        try:
            await store.create_session(SessionKey("local", "local", "gone"), "a", ttl_seconds=0.01)
            await store.create_session(SessionKey("local", "local", "live"), "a")
        finally:
            await store.close()

    asyncio.run(go())
    time.sleep(0.05)
    listed = runner.invoke(app, ["sessions", "list", "--data-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "gone" in listed.output and "live" in listed.output
