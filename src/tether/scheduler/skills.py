"""A session's active skills, as one turn sees and changes them (``activate_skill``).

The active set is session state (:data:`~tether.store.rules.ACTIVE_SKILLS_KEY`): read when the
turn starts, so a session resumed in another process, or on another node, gets the same skills
back; written through the store as soon as the model activates one, fenced by the turn's lease
in the same transaction, so a process that lost the session can never change its skills.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from tether.agent import Agent
from tether.errors import ToolError
from tether.records import Lease
from tether.store.rules import ACTIVE_SKILLS_KEY, active_skills


class StateWrites(Protocol):
    async def set_state(self, lease: Lease, name: str, value: Any) -> None: ...


class SessionSkills:
    """The turn's :class:`~tether.loop.context.LoopSkills`: the skills active in its session,
    checked against the agent running the turn now (a handoff may change it)."""

    def __init__(
        self,
        store: StateWrites,
        lease: Lease,
        agent: Callable[[], Agent],
        state: dict[str, Any],
    ) -> None:
        self._store = store
        self._lease = lease
        self._agent = agent
        self._active = active_skills(state)
        self._initial = self._active
        # Two activations in one model step run at once: each must build on the other's.
        self._lock = asyncio.Lock()

    @property
    def active(self) -> tuple[str, ...]:
        return self._active

    async def activate(self, name: str) -> str:
        async with self._lock:
            return await self._activate(name)

    async def _activate(self, name: str) -> str:
        agent = self._agent()
        if agent.skill_named(name) is None:
            offered = ", ".join(s.name for s in agent.skills) or "none"
            raise ToolError(f"there is no skill named {name!r}; the skills are: {offered}")
        if name in self._active:
            return f"The {name} skill is already active: its instructions are in your prompt."
        active = (*self._active, name)
        # Durable before the model reads that it worked: the session keeps the skill even if
        # this process stops right after (StaleLease, nothing written, once it lost the lease).
        await self._store.set_state(self._lease, ACTIVE_SKILLS_KEY, list(active))
        self._active = active
        return (
            f"The {name} skill is active: its instructions are now in your system prompt, for"
            " the rest of this conversation. Follow them."
        )

    async def undo(self) -> None:
        """Back to the skills the session had when the turn took them up. A turn whose items
        are not kept (failed, rolled back) keeps nothing else it wrote either (DESIGN §3): the
        model that activated a skill never said so, as far as later turns can see."""
        async with self._lock:
            if self._active != self._initial:
                await self._store.set_state(self._lease, ACTIVE_SKILLS_KEY, list(self._initial))
                self._active = self._initial
