"""Skills: folders of instructions an agent offers, and the model activates when it needs one.

A skill is a folder holding a ``SKILL.md``: YAML front matter between two ``---`` lines with
its ``name`` and ``description``, then the instructions as markdown, and any files the
instructions mention (reachable only through tools the agent has; :attr:`Skill.root` says
where they are). ``Agent(skills=[...])`` lists each skill's name and description in the system
prompt and offers :data:`activate_skill`; once activated, a skill's instructions are in the
system prompt of every later model call of the session. The active set is session state (the
scheduler keeps it in the store, fenced by the turn's lease), so a session resumed in another
process gets the same skills back.

Everything here is free of I/O but :func:`load_skill` and :func:`load_skills`, which read the
folders once, when the agent is defined.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tether.errors import ConfigError, ToolError
from tether.tools.context import ToolContext
from tether.tools.tool import tool

SKILL_FILE = "SKILL.md"
MAX_SKILL_FILE_BYTES = 256 * 1024
"""A ``SKILL.md`` larger than this is refused before it is parsed."""
MAX_DESCRIPTION_CHARS = 1024
"""Every skill's description is in every prompt of the agent: it must stay short."""
MAX_INSTRUCTIONS_CHARS = 32_000
"""An active skill's instructions are in every later prompt of the session (about 8k tokens)."""
MAX_SKILLS = 100
"""Skills one agent may offer (each costs its description in every prompt)."""

_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill, as read from its folder."""

    name: str
    """Lower-case letters, digits, ``-`` and ``_``, at most 64: what ``activate_skill`` takes."""
    description: str
    """When to use it: listed in the agent's system prompt so the model can choose."""
    instructions: str
    """The markdown body of ``SKILL.md``: added to the system prompt once activated."""
    root: Path
    """The skill's folder (its other files); tether itself gives the model no access to it."""

    def __post_init__(self) -> None:
        _check(self.name, self.description, self.instructions, where=f"skill {self.name!r}")


def _check(name: object, description: object, instructions: str, *, where: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: name must be 1 to 64 of a-z, 0-9, '-' and '_' (got {name!r})")
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(f"{where}: description must be a non-empty string")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ConfigError(f"{where}: description is over {MAX_DESCRIPTION_CHARS} characters")
    if len(instructions) > MAX_INSTRUCTIONS_CHARS:
        raise ConfigError(f"{where}: instructions are over {MAX_INSTRUCTIONS_CHARS} characters")


def parse_skill(text: str, root: Path) -> Skill:
    """The skill a ``SKILL.md``'s text describes (``root``: its folder); ConfigError saying
    what is wrong otherwise."""
    where = str(root / SKILL_FILE)
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{where}: must start with front matter between '---' lines")
    end = next((n for n, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        raise ConfigError(f"{where}: the front matter has no closing '---' line")
    try:
        # safe_load: front matter is data; no tag may construct an object.
        meta = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: the front matter is not valid YAML: {exc}") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: the front matter must be a mapping with name and description")
    name, description = meta.get("name"), meta.get("description")
    instructions = "\n".join(lines[end + 1 :]).strip()
    _check(name, description, instructions, where=where)
    assert isinstance(name, str) and isinstance(description, str)
    return Skill(name, description.strip(), instructions, root)


def load_skill(path: str | Path) -> Skill:
    """Read the skill in folder ``path`` (or the ``SKILL.md`` it names)."""
    p = Path(path).expanduser()
    file = p if p.name == SKILL_FILE and p.is_file() else p / SKILL_FILE
    if not file.is_file():
        raise ConfigError(f"{p}: not a skill (no {SKILL_FILE} in it)")
    if file.stat().st_size > MAX_SKILL_FILE_BYTES:
        raise ConfigError(f"{file}: over {MAX_SKILL_FILE_BYTES} bytes")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot be read: {exc}") from None
    return parse_skill(text, file.parent.resolve())


def load_skills(directory: str | Path) -> tuple[Skill, ...]:
    """Every skill in ``directory``: each sub-folder holding a ``SKILL.md``, by folder name
    (the others are left alone). Two skills of one name are refused."""
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise ConfigError(f"{d}: not a directory of skills")
    found = [load_skill(sub) for sub in sorted(d.iterdir()) if (sub / SKILL_FILE).is_file()]
    return unique(found)


def unique(skills: Iterable[Skill]) -> tuple[Skill, ...]:
    """``skills`` as a tuple, refusing two of one name (which would ``activate_skill``?)."""
    out = tuple(skills)
    seen: dict[str, Skill] = {}
    for s in out:
        if not isinstance(s, Skill):
            raise ConfigError(f"{s!r} is not a skill; give a Skill or a skill's folder")
        if s.name in seen:
            raise ConfigError(f"two skills are named {s.name!r}: {seen[s.name].root} and {s.root}")
        seen[s.name] = s
    if len(out) > MAX_SKILLS:
        raise ConfigError(f"{len(out)} skills: an agent may offer at most {MAX_SKILLS}")
    return out


def coerce_skills(values: Iterable[Skill | str | Path] | str | Path) -> tuple[Skill, ...]:
    """``Agent(skills=...)``: skills, or folders to read them from (a folder holding a
    ``SKILL.md`` is one skill; a folder of skill folders gives each)."""
    if isinstance(values, str | Path):
        values = [values]
    out: list[Skill] = []
    for v in values:
        if isinstance(v, Skill):
            out.append(v)
        elif isinstance(v, str | Path):
            p = Path(v).expanduser()
            is_one = (p / SKILL_FILE).is_file() or p.name == SKILL_FILE
            out.extend([load_skill(p)] if is_one else load_skills(p))
        else:
            raise ConfigError(f"{v!r} is not a skill; give a Skill or a skill's folder")
    return unique(out)


# -- the prompt -----------------------------------------------------------------------------------
def skills_prompt(skills: Sequence[Skill], active: Iterable[str]) -> str:
    """What the system prompt says of an agent's skills: each one offered, how to activate
    one, then the instructions of those active (in the agent's order). "" without skills."""
    if not skills:
        return ""
    on = set(active)
    listing = "\n".join(
        f"- {s.name}{' (active)' if s.name in on else ''}: {s.description}" for s in skills
    )
    parts = [
        "## Skills\n"
        "You have these skills. When a task matches one that is not active, call the"
        " activate_skill tool with its name first; its instructions then appear below.\n" + listing
    ]
    for s in skills:
        if s.name in on:
            parts.append(f'<skill name="{s.name}">\n{s.instructions}\n</skill>')
    return "\n\n".join(parts)


def with_skills(instructions: str, skills: Sequence[Skill], active: Iterable[str]) -> str:
    """The agent's instructions followed by its skills block (when it has skills)."""
    block = skills_prompt(skills, active)
    return f"{instructions}\n\n{block}" if block else instructions


# -- the built-in tool ----------------------------------------------------------------------------
NOT_AVAILABLE = "Skills are not available here."


@tool
async def activate_skill(name: str, ctx: ToolContext) -> str:
    """Activate one of your skills: its instructions are added to your instructions for the
    rest of this conversation. Call it before doing a task one of your skills is for.

    Args:
        name: The skill's name, exactly as listed under Skills.
    """
    if ctx.skills is None:
        raise ToolError(NOT_AVAILABLE)
    return await ctx.skills.activate(name)
