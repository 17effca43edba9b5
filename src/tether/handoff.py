"""Handoffs: an agent passes the conversation to another agent, inside one session.

``Agent(handoffs=[billing, tech])`` offers the model one ``transfer_to_<name>`` tool per target.
When the model calls one, the turn loop records a ``handoff`` item and event, and the rest of
the turn runs the target agent, on the same session, its history, its lease and its turn
order: a handoff never leaves the session it happens in (DESIGN §10). Following turns of the
session stay with the target until an agent hands on or back.

A target is an :class:`~tether.agent.Agent`, or an agent's name when the target is defined
after the agent that hands to it (a specialist handing back to its triage agent).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from tether.errors import ConfigError
from tether.models.base import ToolSpec

TOOL_PREFIX: Final = "transfer_to_"
MAX_HANDOFFS_PER_TURN: Final = 8
"""Transfers one turn may make: agents handing a conversation back and forth forever would
otherwise spend the turn's steps on nothing."""

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "reason": {
            "type": "string",
            "description": "Why the conversation is transferred, in one sentence.",
        }
    },
    "additionalProperties": False,
}


class HandoffTarget(Protocol):
    """What a handoff needs of its target agent (an :class:`~tether.agent.Agent`)."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def fingerprint(self) -> str: ...


def transfer_tool_name(agent_name: str) -> str:
    """``transfer_to_`` and the agent's name in snake case: ``Billing Agent`` →
    ``transfer_to_billing_agent``."""
    snake = re.sub(r"[^a-z0-9]+", "_", agent_name.lower()).strip("_") or "agent"
    return (TOOL_PREFIX + snake)[:64]


@dataclass(frozen=True, slots=True)
class Handoff:
    """One target of an agent's handoffs and the tool that transfers to it."""

    agent_name: str
    tool_name: str
    description: str
    agent: HandoffTarget | None = None
    """The target itself when it was given as an agent (it is then served with the agent
    that hands to it); None when given by name (it must be served under that name)."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.tool_name, self.description, _PARAMETERS)

    def result(self) -> str:
        """What the model reads as the transfer's result."""
        return f"Transferred to {self.agent_name}. {self.agent_name} answers from here."


def handoff(
    agent: HandoffTarget | str,
    *,
    tool_name_override: str | None = None,
    tool_description_override: str | None = None,
) -> Handoff:
    """A handoff to ``agent`` (an agent, or the name of one served by the same app), with the
    transfer tool's name and description chosen here instead of derived from the target."""
    if not isinstance(agent, str) and not _is_target(agent):
        raise ConfigError(f"a handoff needs an agent or an agent's name, not {agent!r}")
    name = agent if isinstance(agent, str) else agent.name
    if not name or not isinstance(name, str):
        raise ConfigError("a handoff needs an agent or an agent's name")
    if tool_description_override is not None and not isinstance(tool_description_override, str):
        raise ConfigError("a handoff's tool_description_override is text")
    tool_name = transfer_tool_name(name) if tool_name_override is None else tool_name_override
    if not isinstance(tool_name, str) or not _TOOL_NAME.match(tool_name):
        raise ConfigError(f"handoff tool name {tool_name!r} must be 1-64 of [a-zA-Z0-9_-]")
    about = "" if isinstance(agent, str) else agent.description
    description = tool_description_override or (
        f"Transfer the conversation to the {name} agent" + (f": {about}" if about else ".")
    )
    return Handoff(name, tool_name, description, None if isinstance(agent, str) else agent)


def handoffs_of(values: object, owner: str) -> tuple[Handoff, ...]:
    """``Agent(handoffs=…)``: agents, names and :func:`handoff` values, checked."""
    if values is None:
        return ()
    if isinstance(values, str | Mapping) or not isinstance(values, Iterable):
        raise ConfigError(f"agent {owner}: handoffs takes a list of agents")
    out: list[Handoff] = []
    for value in values:
        if isinstance(value, Handoff):
            out.append(value)
        elif isinstance(value, str) or _is_target(value):
            out.append(handoff(value))
        else:
            raise ConfigError(f"agent {owner}: {value!r} is not an agent to hand off to")
    names = [h.agent_name for h in out]
    if owner in names:
        raise ConfigError(f"agent {owner} cannot hand off to itself")
    if len(set(names)) != len(names):
        raise ConfigError(f"agent {owner}: two handoffs to one agent")
    tools = [h.tool_name for h in out]
    twice = sorted({t for t in tools if tools.count(t) > 1})
    if twice:
        raise ConfigError(f"agent {owner}: two handoffs share the tool name {twice[0]}")
    return tuple(out)


def _is_target(value: object) -> bool:
    return all(hasattr(value, a) for a in ("name", "description", "fingerprint"))
