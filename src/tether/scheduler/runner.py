"""Running one turn under its session's lease, to exactly one recorded ending.

The worker that holds the lease hands each queued turn to :class:`TurnRunner`, which gives the
turn loop its context (agent, model, history reader, fenced sink, memory) and commits what the
loop returns. Every way out — an answer, a cancellation, a model failure, an agent no longer
served — ends in one ``end_turn`` and wakes the callers waiting for the turn; only a lost lease
(:class:`StaleLease`) leaves the ending to the session's next owner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from tether.agent import Agent
from tether.loop.context import TurnContext
from tether.loop.turn import run_turn
from tether.memory.service import MemoryService
from tether.memory.tools import memory_tools
from tether.memory.turn_memory import TurnMemory
from tether.models import resolve_model
from tether.records import Item, Lease, NewItem, Principal, Turn, TurnEnding
from tether.scheduler.feeds import TurnFeed
from tether.scheduler.local import Local, RunningTurn
from tether.scheduler.sink import FencedSink, StoreHistory
from tether.store.protocol import FencedWrites, HistoryStore
from tether.store.rules import terminal_event_data
from tether.tools.approval import Approver
from tether.tools.workspace import workspace_dir

log = logging.getLogger("tether.scheduler")

AgentResolver = Callable[[str], Agent | None]


class TurnStore(FencedWrites, HistoryStore, Protocol):
    """What running a turn needs of the store: its fenced writes and its history."""


class TurnRunner:
    def __init__(
        self,
        store: TurnStore,
        local: Local,
        agents: AgentResolver,
        *,
        approver: Approver | None,
        workspace_root: Path | None,
        default_model: str | None,
        memory: MemoryService | None,
    ) -> None:
        self._store = store
        self._local = local
        self._agents = agents
        self.approver = approver
        self.workspace_root = workspace_root
        self.default_model = default_model
        self.memory = memory

    async def run(self, lease: Lease, turn: Turn, agent_name: str | None) -> None:
        """Run ``turn`` to its ending and hand the ended turn to whoever waits for it.

        Raises :class:`StaleLease` when the session was lost meanwhile: nothing more was written.
        """
        feed = TurnFeed(turn.id)
        self._local.feeds[turn.id] = feed
        sink = FencedSink(self._store, lease, turn.id, feed)
        try:
            done = await self._run(sink, turn, agent_name)
        finally:
            sink.close()
            feed.close()
            self._local.feeds.pop(turn.id, None)
            self._local.free_slot(turn.key)
        self._local.resolve(done)

    async def _run(self, sink: FencedSink, turn: Turn, agent_name: str | None) -> Turn:
        user_item = await sink.start(turn.input)
        agent = self._agents(agent_name) if agent_name is not None else None
        if agent is None:
            ending = TurnEnding(
                "failed", "agent_not_found", error=f"agent {agent_name or '?'} is not served"
            )
            return await _end(sink, turn, ending, [])
        ctx, memory = self._context(sink, turn, agent, user_item)
        self._local.running[turn.id] = RunningTurn(turn, ctx)
        try:
            result = await run_turn(ctx)
        finally:
            self._local.running.pop(turn.id, None)
        done = await _end(sink, turn, result.ending, result.items)
        if done.status == "rolled_back" and memory is not None:
            await _forget_turn_memory(memory)
        return done

    def _context(
        self, sink: FencedSink, turn: Turn, agent: Agent, user_item: Item
    ) -> tuple[TurnContext, TurnMemory | None]:
        key = turn.key
        ctx = TurnContext(
            agent=agent,
            model=resolve_model(agent.model if agent.model is not None else self.default_model),
            key=key,
            principal=self._local.principal_of(key),
            turn_id=turn.id,
            input=turn.input,
            input_seq=user_item.seq,
            history=StoreHistory(self._store, key),
            sink=sink,
            approver=self.approver,
            workspace=workspace_dir(self.workspace_root, key) if self.workspace_root else None,
        )
        if self.memory is None:
            return ctx, None
        # Memory belongs to the session's owner (embedded use may act for a user_id other than
        # the caller's principal), with the caller's roles.
        owner = Principal(key.tenant, key.owner, ctx.principal.roles)
        memory = TurnMemory(self.memory, owner, key, agent.name, agent.memory, turn.id)
        ctx.memory = memory
        ctx.extra_tools = memory_tools(agent.memory.remember, agent.memory.knowledge_tool)
        return ctx, memory


async def _end(sink: FencedSink, turn: Turn, ending: TurnEnding, items: list[NewItem]) -> Turn:
    return await sink.end(ending, items, terminal_event_data(turn.id, ending))


async def _forget_turn_memory(memory: TurnMemory) -> None:
    # A rolled-back turn leaves no trace in history; what it noted goes with it.
    try:
        await memory.forget_turn()
    except Exception:
        log.warning("could not remove the memory of a rolled-back turn", exc_info=True)
