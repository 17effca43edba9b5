"""What the scheduler hands the turn loop: the turn, a history reader and a fenced sink.

The loop never touches the store or HTTP: it reads history through :class:`HistoryReader` and
writes through :class:`TurnSink`, whose every write the scheduler fences with the session lease.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tether.agent import Agent
from tether.events import EventType
from tether.handoff import Handoff
from tether.loop.window import ItemMemo
from tether.models.base import Model, ToolSpec
from tether.records import (
    CancelStatus,
    Decision,
    Hit,
    Item,
    MemoryRecord,
    NewDecision,
    NewItem,
    Principal,
    Reason,
    SessionKey,
    TurnEnding,
    Usage,
)
from tether.skills import with_skills
from tether.tools.context import ToolMemory, ToolSkills
from tether.tools.tool import Tool
from tether.tools.workspace import DEFAULT_QUOTA_BYTES


class LoopMemory(ToolMemory, Protocol):
    """What the loop needs of the turn's memory (the scheduler passes a
    :class:`~tether.memory.turn_memory.TurnMemory`): recall before the model runs, automatic
    notes, and what tools may do with it."""

    async def recall(self, query: str) -> list[Hit]:
        """Memory items and knowledge chunks for the prompt, best first."""
        ...

    async def keep_notes(self, text: str) -> list[MemoryRecord]:
        """Automatic notes from the user's message."""
        ...


class LoopSkills(ToolSkills, Protocol):
    """The session's skills (the scheduler passes a
    :class:`~tether.scheduler.skills.SessionSkills`): which are active, for the prompt, and
    ``activate`` for the tool."""

    @property
    def active(self) -> tuple[str, ...]:
        """Names of the skills active in the session, in the order they were activated."""
        ...


class HistoryReader(Protocol):
    async def recent(self, before_seq: int | None, limit: int) -> list[Item]:
        """Items that may reach the model, newest first, older than ``before_seq``."""
        ...

    async def latest_summary(self) -> Item | None:
        """The newest summary item that may reach the model, if any."""
        ...


class TurnSink(Protocol):
    def emit(self, type: EventType, data: dict[str, Any]) -> None:
        """Publish an event now (live subscribers) and persist it with the next commit."""
        ...

    async def commit(self, items: Sequence[NewItem]) -> list[Item]:
        """Durably write items and every event emitted so far, fenced by the lease.

        The write is shielded: once started it completes even if the turn is cancelled, so what
        is durable is always known (see :meth:`open_calls`).
        """
        ...

    async def settle(self) -> None:
        """Wait for a commit still in flight (after a cancellation interrupted its caller)."""
        ...

    def open_calls(self) -> list[tuple[str, str]]:
        """``(call_id, tool_name)`` of committed tool calls that have no committed result."""
        ...


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a turn that parked on a decision goes on from (DESIGN §3): its own items so far,
    its decisions, and what the store kept of it while it waited."""

    items: list[Item]
    """The turn's items in seq order, its user message first."""
    decisions: dict[str, Decision]
    """call id → the turn's decisions (the one it waited for is decided or expired)."""
    started_calls: frozenset[str]
    """Calls whose ``tool.started`` was written: they ran (or began to) already."""
    usage: Usage


@dataclass(frozen=True, slots=True)
class Switch:
    """What the rest of a turn runs after a handoff: the target agent, its model and its
    built-in tools, as the scheduler resolves them."""

    agent: Agent
    model: Model
    extra_tools: tuple[Tool, ...] = ()


def _nobody(target: Handoff) -> Switch | None:
    return None


def _not_served(target: Handoff) -> bool:
    return False


@dataclass
class TurnContext:
    agent: Agent
    model: Model
    key: SessionKey
    principal: Principal
    turn_id: str
    input: str
    input_seq: int
    """``seq`` of the stored user item of this turn; history is what came before it."""
    history: HistoryReader
    sink: TurnSink
    memo: ItemMemo = field(default_factory=ItemMemo)
    """What the history's items cost and render to: the scheduler passes the one it keeps for
    the session's lease, so the next turn's window reuses this one's."""
    resumed: Resumed | None = None
    """Set when the turn goes on after a decision rather than starting."""
    always: frozenset[str] = frozenset()
    """Tools the session approved for good (``always``): they run without asking."""
    workspace: Path | None = None
    """The session's own directory, named by a hash of its key
    (:func:`~tether.tools.workspace.workspace_dir`); created by the tool that first uses it."""
    workspace_quota: int = DEFAULT_QUOTA_BYTES
    """Bytes the workspace may hold (:func:`~tether.tools.workspace.check_quota`)."""
    memory: LoopMemory | None = None
    skills: LoopSkills | None = None
    """The session's active skills (None: the agent has none, nor has any it hands off to)."""
    extra_tools: tuple[Tool, ...] = ()
    """Built-in tools the agent's memory policy turned on (``remember``, ``search_knowledge``)."""
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    cancel_status: CancelStatus = "cancelled"
    """What a cancellation ends the turn as: ``cancelled``, ``interrupted``, ``rolled_back``, or
    ``failed`` (its process lost the lease)."""
    cancel_reason: Reason = "cancelled"
    hand_to: Callable[[Handoff], Switch | None] = _nobody
    """The agent a handoff names, ready to run; None when it is not served here."""
    can_hand_to: Callable[[Handoff], bool] = _not_served
    """Whether a handoff's target is served here (without making its model ready)."""
    _body: asyncio.Task[TurnResult | TurnPark] | None = field(default=None, repr=False)

    @property
    def instructions(self) -> str:
        """What heads the system prompt: the running agent's instructions, then its skills
        (each one offered, and the instructions of those the session activated)."""
        active = self.skills.active if self.skills is not None else ()
        return with_skills(self.agent.instructions, self.agent.skills, active)

    @property
    def tools(self) -> tuple[Tool, ...]:
        return self.agent.tools + self.extra_tools

    def tool_named(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def specs(self) -> tuple[ToolSpec, ...]:
        """What the model is offered: the tools, then a transfer tool per handoff whose target
        is served here (a transfer that cannot happen is not offered)."""
        transfers = tuple(h.spec for h in self.agent.handoffs if self.can_hand_to(h))
        return tuple(t.spec for t in self.tools) + transfers

    def switch(self, to: Switch) -> None:
        """Run the rest of the turn as ``to.agent`` (a handoff)."""
        self.agent, self.model, self.extra_tools = to.agent, to.model, to.extra_tools

    def request_cancel(
        self, status: CancelStatus = "cancelled", reason: Reason = "cancelled"
    ) -> bool:
        """Ask the running turn to stop; it ends as ``status`` with ``reason``.

        Returns False when a cancellation was already requested (the first one wins).
        """
        if self.cancelled.is_set():
            return False
        self.cancel_status, self.cancel_reason = status, reason
        self.cancelled.set()
        if self._body is not None:
            self._body.cancel()
        return True


@dataclass(frozen=True, slots=True)
class TurnResult:
    ending: TurnEnding
    items: list[NewItem]
    """Last items to commit with the ending (partial reply, results of unanswered calls)."""


@dataclass(frozen=True, slots=True)
class TurnPark:
    """The turn waits for a human: park it on ``decision`` (DESIGN §3 ``awaiting_input``)."""

    decision: NewDecision
    items: list[NewItem]
    """Results of the step's calls made before the one asked about, written with the park."""
    usage: Usage = field(default_factory=Usage)
    """What the turn spent so far (it goes on adding to it when resumed)."""
