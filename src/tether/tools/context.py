"""What a tool may ask for about the turn that called it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tether.records import Principal, SessionKey

if TYPE_CHECKING:
    from tether.memory.turn import TurnMemory


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Passed to a tool that declares a parameter annotated ``ToolContext``.

    ``cancelled`` is set when the turn is cancelled, so a long-running tool can stop early; an
    async tool is also cancelled outright.
    """

    session: SessionKey
    principal: Principal
    turn_id: str
    call_id: str
    cancelled: asyncio.Event
    workspace: Path | None = None
    memory: TurnMemory | None = None
    """The caller's memory and the agent's knowledge (None when the runtime has no memory)."""
