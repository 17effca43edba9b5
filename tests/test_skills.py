"""Skills: SKILL.md folders an agent offers, the model activates, and the session keeps.

The active set is session state written under the turn's lease, so the skill a model activated
is in the prompt of the next step, of later turns, and of the session resumed by another
runtime on the same store (SQLite file or PostgreSQL), in another OS process too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tether import Agent
from tether.errors import ConfigError, TurnFailed
from tether.models.base import ModelRequest
from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.runtime import Runtime
from tether.skills import (
    MAX_DESCRIPTION_CHARS,
    MAX_INSTRUCTIONS_CHARS,
    Skill,
    load_skill,
    load_skills,
    parse_skill,
)
from tether.store import PostgresStore, SQLiteStore
from tether.store.protocol import Store
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.testing.scripted import Fail

PDF_RULES = "Always answer with the page number first. PDF-RULE-7731."
SQL_RULES = "Write SQL in upper case. SQL-RULE-4410."


def write_skill(root: Path, folder: str, front: str, body: str) -> Path:
    d = root / folder
    d.mkdir(parents=True)
    (d / "SKILL.md").write_text(f"---\n{front}\n---\n{body}\n", encoding="utf-8")
    return d


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    write_skill(root, "pdf", "name: pdf\ndescription: Read and cite PDF files.", PDF_RULES)
    write_skill(root, "sql", 'name: sql\ndescription: "Write SQL: queries."', SQL_RULES)
    (root / "notes").mkdir()  # no SKILL.md: not a skill
    return root


def system_of(r: ModelRequest) -> str:
    assert r.messages[0].role == "system"
    return r.messages[0].content


def tool_results(model: ScriptedModel) -> list[str]:
    last = model.requests[-1]
    return [m.content for m in last.messages if m.role == "tool"]


# -- parsing -------------------------------------------------------------------------------------
def test_a_skill_folder_is_read(skills_dir: Path) -> None:
    s = load_skill(skills_dir / "pdf")
    assert s == Skill("pdf", "Read and cite PDF files.", PDF_RULES, (skills_dir / "pdf").resolve())
    assert load_skill(skills_dir / "pdf" / "SKILL.md") == s
    assert [x.name for x in load_skills(skills_dir)] == ["pdf", "sql"]
    assert load_skills(skills_dir)[1].description == "Write SQL: queries."


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: pdf\ndescription: d\n\nbody", "must start with front matter"),
        ("---\nname: pdf\ndescription: d\nbody", "no closing '---'"),
        ("---\nname: [pdf\n---\nbody", "not valid YAML"),
        ("---\n- pdf\n---\nbody", "must be a mapping"),
        ("---\n!!python/object:os.system ls\n---\nbody", "not valid YAML"),
        ("---\ndescription: d\n---\nbody", "name must be"),
        ("---\nname: PDF\ndescription: d\n---\nbody", "name must be"),
        ("---\nname: my skill\ndescription: d\n---\nbody", "name must be"),
        ("---\nname: ../up\ndescription: d\n---\nbody", "name must be"),
        (f"---\nname: {'a' * 65}\ndescription: d\n---\nbody", "name must be"),
        ("---\nname: 7\ndescription: d\n---\nbody", "name must be"),
        ("---\nname: pdf\n---\nbody", "description must be"),
        ("---\nname: pdf\ndescription: '  '\n---\nbody", "description must be"),
        (
            f"---\nname: pdf\ndescription: {'d' * (MAX_DESCRIPTION_CHARS + 1)}\n---\nbody",
            "description is over",
        ),
        (
            f"---\nname: pdf\ndescription: d\n---\n{'x' * (MAX_INSTRUCTIONS_CHARS + 1)}",
            "instructions are over",
        ),
    ],
)
def test_bad_skills_are_refused_saying_why(text: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=says) as caught:
        parse_skill(text, tmp_path)
    assert str(tmp_path / "SKILL.md") in str(caught.value)


def test_missing_and_duplicate_skills_are_refused(skills_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no SKILL\.md"):
        load_skill(skills_dir / "notes")
    with pytest.raises(ConfigError, match="not a directory"):
        load_skills(tmp_path / "nowhere")
    write_skill(skills_dir, "pdf-again", "name: pdf\ndescription: Another.", "x")
    with pytest.raises(ConfigError, match="two skills are named 'pdf'"):
        load_skills(skills_dir)
    pdf = Skill("pdf", "d", "i", tmp_path)
    with pytest.raises(ConfigError, match="two skills are named 'pdf'"):
        Agent(name="a", skills=[pdf, skills_dir / "pdf"])
    with pytest.raises(ConfigError, match="name must be"):
        Skill("Bad Name", "d", "i", tmp_path)


# -- the agent -----------------------------------------------------------------------------------
def test_agents_take_skills_and_their_fingerprint_covers_them(
    skills_dir: Path, tmp_path: Path
) -> None:
    by_path = Agent(name="a", skills=[skills_dir / "pdf", str(skills_dir / "sql")])
    by_dir = Agent(name="a", skills=skills_dir)
    assert [s.name for s in by_path.skills] == ["pdf", "sql"] == [s.name for s in by_dir.skills]
    assert by_path.fingerprint == by_dir.fingerprint
    assert by_path.skill_named("sql") is not None and by_path.skill_named("x") is None
    # The same skill checked out elsewhere is the same definition; other words are not.
    moved = Skill("pdf", "Read and cite PDF files.", PDF_RULES, tmp_path / "elsewhere")
    assert (
        Agent(name="a", skills=[moved]).fingerprint
        == Agent(name="a", skills=[skills_dir / "pdf"]).fingerprint
    )
    changed = Skill("pdf", "Read and cite PDF files.", PDF_RULES + " More.", tmp_path)
    fingerprints = {
        Agent(name="a").fingerprint,
        Agent(name="a", skills=[moved]).fingerprint,
        Agent(name="a", skills=[changed]).fingerprint,
        by_path.fingerprint,
    }
    assert len(fingerprints) == 4


def test_a_skill_tool_clash_is_refused(skills_dir: Path) -> None:
    from tether import tool

    @tool
    def activate_skill(name: str) -> str:
        """Mine."""
        return name

    with pytest.raises(ConfigError, match="activate_skill"):
        Agent(name="a", tools=[activate_skill], skills=[skills_dir / "pdf"])
    assert Agent(name="a", tools=[activate_skill]).tool_named("activate_skill") is not None


# -- turns ---------------------------------------------------------------------------------------
def sqlite_at(tmp_path: Path) -> Callable[[], Store]:
    return lambda: SQLiteStore(tmp_path / "tether.db")


def scripted(*steps: str | ToolCalls | Fail) -> ScriptedModel:
    return ScriptedModel(*steps)


def agent_with(model: ScriptedModel, skills: Path | list[Path]) -> Agent:
    return Agent(name="helper", model=model, skills=skills, memory=False)


async def active_in_store(rt: Runtime, sid: str) -> object:
    record = await rt.store.get_session(SessionKey.of(LOCAL_PRINCIPAL, sid))
    assert record is not None
    return record.state.get("active_skills")


async def test_the_prompt_lists_the_skills_and_activating_one_adds_its_instructions(
    skills_dir: Path, tmp_path: Path
) -> None:
    model = scripted(
        ToolCalls(Call("activate_skill", {"name": "pdf"})), "page 3: yes", "ok", "fresh"
    )
    agent = agent_with(model, skills_dir)
    async with Runtime(sqlite_at(tmp_path)(), data_dir=tmp_path, agents=[agent]) as rt:
        assert await rt.chat(agent, "what does the PDF say?", session_id="s") == "page 3: yes"
        first, second = model.requests[:2]
        # Offered, not yet active: listed with its description, its instructions not sent.
        assert "- pdf: Read and cite PDF files." in system_of(first)
        assert "- sql: Write SQL: queries." in system_of(first)
        assert "activate_skill" in system_of(first)
        assert PDF_RULES not in system_of(first)
        assert "activate_skill" in [t.name for t in first.tools]
        # The next step of the same turn already has them.
        assert "is active" in tool_results(model)[0]
        assert PDF_RULES in system_of(second) and SQL_RULES not in system_of(second)
        assert "- pdf (active):" in system_of(second)
        assert await active_in_store(rt, "s") == ["pdf"]
        # And the next turn, from the session's state.
        assert await rt.chat(agent, "thanks", session_id="s") == "ok"
        assert PDF_RULES in system_of(model.requests[2])
        # Another session of the same agent has its own set.
        assert await rt.chat(agent, "hi", session_id="t") == "fresh"
        assert PDF_RULES not in system_of(model.requests[3])


async def test_an_unknown_skill_is_refused_and_nothing_changes(
    skills_dir: Path, tmp_path: Path
) -> None:
    model = scripted(ToolCalls(Call("activate_skill", {"name": "excel"})), "sorry")
    agent = agent_with(model, skills_dir)
    async with Runtime(sqlite_at(tmp_path)(), data_dir=tmp_path, agents=[agent]) as rt:
        assert await rt.chat(agent, "open the sheet", session_id="s") == "sorry"
        (refusal,) = tool_results(model)
        assert refusal == "Error: there is no skill named 'excel'; the skills are: pdf, sql"
        assert PDF_RULES not in system_of(model.requests[1])
        assert await active_in_store(rt, "s") is None


async def test_activating_twice_keeps_one_and_two_skills_keep_the_agents_order(
    skills_dir: Path, tmp_path: Path
) -> None:
    model = scripted(
        ToolCalls(Call("activate_skill", {"name": "sql"})),
        ToolCalls(Call("activate_skill", {"name": "pdf"})),
        ToolCalls(Call("activate_skill", {"name": "pdf"})),
        "done",
    )
    agent = agent_with(model, skills_dir)
    async with Runtime(sqlite_at(tmp_path)(), data_dir=tmp_path, agents=[agent]) as rt:
        assert await rt.chat(agent, "both", session_id="s") == "done"
        assert "already active" in tool_results(model)[-1]
        last = system_of(model.requests[-1])
        assert last.count(PDF_RULES) == 1 and last.index(PDF_RULES) < last.index(SQL_RULES)
        assert await active_in_store(rt, "s") == ["sql", "pdf"]


async def test_a_failed_turn_keeps_no_skill_it_activated(skills_dir: Path, tmp_path: Path) -> None:
    """DESIGN §3: what a turn writes besides items is kept only if its items are (not for
    failed or rolled back). The activation stayed in the session's state after the turn
    failed, its instructions in every later prompt, though no later turn sees it happen."""
    model = scripted(
        ToolCalls(Call("activate_skill", {"name": "sql"})),
        ToolCalls(Call("activate_skill", {"name": "pdf"})),
        Fail("boom", transient=False),
        "fine",
    )
    agent = agent_with(model, skills_dir)
    async with Runtime(sqlite_at(tmp_path)(), data_dir=tmp_path, agents=[agent]) as rt:
        key = SessionKey("local", "local", "s")
        await rt.sessions.create(key, agent.name)
        await rt.sessions.update(key, state={"active_skills": ["sql"]})  # kept from before
        with pytest.raises(TurnFailed):
            await rt.chat(agent, "read the PDF", session_id="s")
        assert await active_in_store(rt, "s") == ["sql"]
        assert await rt.chat(agent, "again", session_id="s") == "fine"
        assert PDF_RULES not in system_of(model.requests[-1])
        assert SQL_RULES in system_of(model.requests[-1])


async def test_agents_without_skills_get_no_skill_tool(tmp_path: Path) -> None:
    model = scripted("hi")
    agent = Agent(name="plain", model=model, memory=False)
    async with Runtime(sqlite_at(tmp_path)(), data_dir=tmp_path, agents=[agent]) as rt:
        assert await rt.chat(agent, "hello", session_id="s") == "hi"
    (request,) = model.requests
    assert request.tools == () and "Skills" not in system_of(request)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """A factory of store objects over one database: what two processes would each open."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")  # skips when not configured
        return lambda: PostgresStore(url)
    return sqlite_at(tmp_path)


async def test_a_skill_activated_in_one_runtime_is_active_after_resuming_in_another(
    skills_dir: Path, tmp_path: Path, shared_store: Callable[[], Store]
) -> None:
    """Two runtimes of one process, on each backend (the two-process test is below)."""
    first_model = scripted(ToolCalls(Call("activate_skill", {"name": "sql"})), "activated")
    first = agent_with(first_model, skills_dir)
    async with Runtime(shared_store(), data_dir=tmp_path / "node-a", agents=[first]) as rt:
        assert await rt.chat(first, "use sql", session_id="shared") == "activated"
    assert SQL_RULES in system_of(first_model.requests[1])

    # Another runtime, its own store connection and its own objects, the same definition.
    second_model = scripted("SELECT 1")
    second = agent_with(second_model, [skills_dir / "pdf", skills_dir / "sql"])
    assert second.fingerprint == first.fingerprint
    async with Runtime(shared_store(), data_dir=tmp_path / "node-b", agents=[second]) as rt:
        assert await rt.chat(second, "go on", session_id="shared") == "SELECT 1"
    (request,) = second_model.requests
    assert SQL_RULES in system_of(request) and PDF_RULES not in system_of(request)


_ONE_PROCESS = """
import asyncio, json, sys
from pathlib import Path
from tether import Agent
from tether.runtime import Runtime
from tether.store import SQLiteStore
from tether.testing import Call, ScriptedModel, ToolCalls

data, skills, step = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if step == "activate":
    model = ScriptedModel(ToolCalls(Call("activate_skill", {"name": "sql"})), "activated")
else:
    model = ScriptedModel("SELECT 1")
agent = Agent(name="helper", model=model, skills=skills, memory=False)


async def main() -> None:
    async with Runtime(SQLiteStore(data / "tether.db"), data_dir=data, agents=[agent]) as rt:
        reply = await rt.chat(agent, "use sql" if step == "activate" else "go on", session_id="s")
    print(json.dumps({"reply": reply, "system": model.requests[-1].messages[0].content}))


asyncio.run(main())
"""


@pytest.mark.slow
def test_a_skill_activated_in_one_process_is_active_after_resuming_in_another(
    skills_dir: Path, tmp_path: Path
) -> None:
    """Two OS processes, one after the other, on one SQLite data dir: nothing of the first
    (a module-level cache, an object) can reach the second but what the store keeps."""
    script = tmp_path / "one_process.py"
    script.write_text(_ONE_PROCESS)
    data = tmp_path / "data"

    def run(step: str) -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, str(script), str(data), str(skills_dir), step],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        said: dict[str, str] = json.loads(done.stdout.splitlines()[-1])
        return said

    first = run("activate")
    assert first["reply"] == "activated" and SQL_RULES in first["system"]
    second = run("resume")
    assert second["reply"] == "SELECT 1"
    assert SQL_RULES in second["system"] and PDF_RULES not in second["system"]
