"""What a tool may ask for about the turn that called it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tether.records import (
    Decision,
    Hit,
    MemoryKind,
    MemoryRecord,
    PersonalScope,
    Principal,
    SessionKey,
)
from tether.tools.workspace import DEFAULT_QUOTA_BYTES


class ToolMemory(Protocol):
    """What a tool may do with the caller's memory: the runtime passes the turn's own memory
    (bound to the caller, the session and the agent's policy), never anyone else's."""

    async def remember(
        self, content: str, *, scope: PersonalScope = "user", kind: MemoryKind = "fact"
    ) -> MemoryRecord:
        """Write session or user memory on the caller's behalf."""
        ...

    async def search_knowledge(self, query: str, *, limit: int = 5) -> list[Hit]:
        """Search the knowledge collections the agent names."""
        ...


class ToolSkills(Protocol):
    """The session's skills as the built-in ``activate_skill`` tool changes them: the runtime
    passes the turn's own, which keeps the active set in the session's state."""

    async def activate(self, name: str) -> str:
        """Activate the agent's skill ``name`` for the rest of the session (durably); returns
        the confirmation the model reads. ToolError when the agent has no such skill."""
        ...


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Passed to a tool that declares a parameter annotated ``ToolContext``.

    ``cancelled`` is set when the call times out or its turn is cancelled. An async tool is also
    cancelled outright; a sync tool runs in a thread Python cannot interrupt, so a long-running
    one should look at ``cancelled.is_set()`` now and then and return when it is.
    """

    session: SessionKey
    principal: Principal
    turn_id: str
    call_id: str
    cancelled: asyncio.Event
    workspace: Path | None = None
    """The session's own directory (named by a hash of its key, so no id reaches outside it);
    it may not exist yet: :func:`~tether.tools.workspace.ensure_workspace` makes it."""
    workspace_quota: int = DEFAULT_QUOTA_BYTES
    """Bytes the workspace may hold in all; writers check with
    :func:`~tether.tools.workspace.check_quota` before they write."""
    memory: ToolMemory | None = None
    """The caller's memory and the agent's knowledge (None when the runtime has no memory)."""
    decision: Decision | None = None
    """The human decision this call waited for (approval, or ``ask_user``'s answer), if any."""
    skills: ToolSkills | None = None
    """The session's skills (None when the agent has none)."""
