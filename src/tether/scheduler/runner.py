"""Running one turn under its session's lease, to exactly one recorded ending.

The worker that holds the lease hands each queued turn to :class:`TurnRunner`, which gives the
turn loop its context (agent, model, history reader, fenced sink, memory) and commits what the
loop returns. Every way out — an answer, a cancellation, a model failure, an agent no longer
served — ends in one ``end_turn`` and wakes the callers waiting for the turn; only a lost lease
(:class:`StaleLease`) leaves the ending to the session's next owner.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Literal, Protocol, cast

from tether.agent import Agent, MemoryPolicy, reachable, resolve_target
from tether.errors import ConfigError, Conflict, TurnNotNext, internal_error_message
from tether.events import TOOL_STARTED
from tether.handoff import Handoff
from tether.loop.context import Resumed, Switch, TurnContext, TurnPark, TurnResult
from tether.loop.turn import run_turn
from tether.memory.service import MemoryService
from tether.memory.tools import memory_tools
from tether.memory.turn_memory import TurnMemory
from tether.models import resolve_model
from tether.records import Item, Lease, MemoryWrites, NewItem, Principal, Turn, TurnEnding
from tether.scheduler.feeds import TurnFeed
from tether.scheduler.history import CachedHistory
from tether.scheduler.local import Admitted, Local, RunningTurn
from tether.scheduler.sink import FencedSink
from tether.scheduler.skills import SessionSkills
from tether.skills import activate_skill
from tether.store.capabilities import ChangeCounter, ReleasingEnd
from tether.store.protocol import DecisionStore, FencedWrites, HistoryStore, SessionReader, TurnLog
from tether.store.rules import (
    aborted_results,
    always_approved,
    keeps_memory,
    new_decision,
    terminal_event_data,
)
from tether.tools.ask_user import ask_user
from tether.tools.mcp import McpSessions
from tether.tools.tool import Tool
from tether.tools.workspace import DEFAULT_QUOTA_BYTES, workspace_dir

log = logging.getLogger("tether.scheduler")

AgentResolver = Callable[[str, str | None], Agent | None]
"""``(name, fingerprint or None)`` → the agent to run: that very definition when it is served
here, else the one served under the name (None: no agent of that name)."""


class TurnStore(FencedWrites, HistoryStore, TurnLog, SessionReader, DecisionStore, Protocol):
    """What running a turn needs of the store: its fenced writes, its history, and to park and
    resume one: its events so far, its decisions, cancel requests left for it, and the
    session's standing approvals and active skills."""


AutoNotes = Literal["default", "on", "off"]
"""Automatic notes server-wide: ``default`` (each agent's choice; unset means on only for the
embedded model), ``on`` (every agent that does not say no), ``off`` (none)."""


def auto_notes_from_env() -> AutoNotes:
    value = (os.environ.get("TETHER_AUTO_NOTES") or "default").strip().lower()
    if value not in ("default", "on", "off"):
        raise ConfigError(f"TETHER_AUTO_NOTES={value!r}: use on, off or default")
    return cast(AutoNotes, value)


def notes_wanted(mode: AutoNotes, agent_says: bool | None, model_name: str) -> bool:
    """Whether a turn keeps automatic notes (DESIGN §8)."""
    if mode == "off" or agent_says is False:
        return False
    if mode == "on" or agent_says is True:
        return True
    # The embedded model answers from its system prompt far better than from history; a real
    # model reads history well and needs no regex guessing at facts.
    return model_name.startswith("local:")


class TurnRunner:
    def __init__(
        self,
        store: TurnStore,
        local: Local,
        agents: AgentResolver,
        *,
        workspace_root: Path | None,
        default_model: str | None,
        workspace_quota: int = DEFAULT_QUOTA_BYTES,
        memory: MemoryService | None,
        auto_notes: AutoNotes = "default",
        mcp: McpSessions | None = None,
    ) -> None:
        self._store = store
        self._local = local
        self._agents = agents
        self.workspace_root = workspace_root
        self.workspace_quota = workspace_quota
        self.default_model = default_model
        self.memory = memory
        self.auto_notes: AutoNotes = auto_notes
        self.mcp = mcp
        """The sessions' MCP connections in this process (None: agents' MCP servers unused)."""
        self._counter = store if isinstance(store, ChangeCounter) else None
        self._releasing = store if isinstance(store, ReleasingEnd) else None

    async def run(
        self,
        lease: Lease,
        turn: Turn,
        agent_name: str | None,
        started: Admitted | None = None,
        let_go: Callable[[], bool] | None = None,
    ) -> bool:
        """Run ``turn`` to its ending (or until it parks on a decision) and hand it to whoever
        waits for it. ``started``: the turn was started as it was admitted, so. ``let_go``:
        asked as the ending is written whether to give the lease up with it (a store that can,
        :class:`ReleasingEnd`). True if the lease was given up so.

        Raises :class:`StaleLease` when the session was lost meanwhile: nothing more was written;
        :class:`TurnNotNext` when an earlier turn of the session is active: nothing was written.
        """
        feed = TurnFeed(turn.id)
        self._local.feeds.open(feed)
        sink: FencedSink | None = None
        try:
            if started is not None:
                sink = FencedSink(self._store, lease, turn.id, feed, history=self._local.history)
                called: frozenset[str] = frozenset()
            else:
                sink, called = await self._sink(lease, turn, feed)
            if let_go is not None and self._releasing is not None:
                sink.let_go(self._releasing, let_go)
            done = await self._run(sink, turn, agent_name, called, started)
        finally:
            if sink is not None:
                sink.close()
            feed.close()
            self._local.feeds.pop(turn.id, None)
            self._local.free_slot(turn.key)
        if not done.ended:
            done = await self._honour_late_cancel(done)
        if done.ended:
            self._local.resolve(done)
        else:
            self._local.parked(done)
        return sink is not None and sink.released

    async def _honour_late_cancel(self, parked: Turn) -> Turn:
        """A cancel or preemption asked through the store while the turn ran, but read by
        nobody before it parked: end it now, parked, rather than when it resumes (a newer turn
        with policy interrupt would otherwise wait for a decision nobody may make)."""
        asked = (await self._store.cancel_requests([parked.id])).get(parked.id)
        if asked is None:
            return parked
        status, reason = asked
        if status == "failed":  # a lost lease: not a request about this turn's outcome
            return parked
        ended = await self._store.end_waiting_turn(parked.key, parked.id, reason, status=status)
        return ended if ended is not None else parked

    def _heard(self) -> int | None:
        return self._counter.heard() if self._counter is not None else None

    async def _asked_meanwhile(self, turn: Turn, ctx: TurnContext, rings: int | None) -> None:
        """A cancel asked before the turn was registered here is honoured as it registers:
        one asked in this process is in ``asked``; one asked by another process, whose ring
        was heard meanwhile (the cancel watcher then read the requests without this turn, and
        would find it only at its safety look a second later), is read for this turn once."""
        asked_here = self._local.asked.pop(turn.id, None)
        if asked_here is not None:
            ctx.request_cancel(*asked_here[1:])  # asked in this process before it registered
        counter = self._counter
        if rings is None or counter is None or counter.heard() == rings:
            return
        asked = (await self._store.cancel_requests([turn.id])).get(turn.id)
        if asked is not None:
            ctx.request_cancel(*asked)

    async def _sink(
        self, lease: Lease, turn: Turn, feed: TurnFeed
    ) -> tuple[FencedSink, frozenset[str]]:
        """The turn's sink, and (resuming) the calls whose ``tool.started`` was written."""
        if turn.started_at is None:
            sink = FencedSink(self._store, lease, turn.id, feed, history=self._local.history)
            return sink, frozenset()
        # Going on after a decision: the turn's events continue after those written so far
        # (its own, and decision.made written by whoever decided).
        last, started = 0, set[str]()
        while True:
            page = await self._store.list_events(turn.key, turn.id, after_seq=last, limit=5000)
            if not page:
                break
            last = page[-1].seq
            started.update(str(e.data.get("call_id")) for e in page if e.type == TOOL_STARTED)
        sink = FencedSink(
            self._store, lease, turn.id, feed, next_seq=last + 1, history=self._local.history
        )
        return sink, frozenset(started)

    async def _run(
        self,
        sink: FencedSink,
        turn: Turn,
        agent_name: str | None,
        started: frozenset[str],
        admitted: Admitted | None = None,
    ) -> Turn:
        resumed: Resumed | None = None
        held: MemoryWrites | None = None
        items: list[Item] = []
        # Started with its admission, it ran in the store from then on: rings heard since
        # may be its cancels.
        rings = admitted.rings if admitted is not None else self._heard()
        try:
            if admitted is not None:
                user_item = sink.started_with_admission(admitted.item)
            elif turn.started_at is None:
                user_item = await sink.start(turn.input)
            else:
                items, held = await sink.resume()
                user_item = next(i for i in items if i.kind == "user")
        except TurnNotNext:
            raise  # an earlier turn comes first: nothing was written; the worker reads the queue
        except Conflict:
            # Another process ended the turn (cancelled it while it waited) between the
            # worker's read of the queue and this start: nothing of it ran here; its ending is
            # the one recorded, and the worker goes on with the rest of the queue.
            now = await self._store.get_turn(turn.key, turn.id)
            if now is None or not now.ended:
                raise
            return now
        if turn.started_at is not None and admitted is None:
            decided = await self._store.list_decisions(turn.key, turn_id=turn.id)
            resumed = Resumed(
                items,
                {d.call_id: d for d in decided},
                started,
                turn.usage,
            )
        wanted = turn.agent.fingerprint if turn.agent is not None else None
        agent = self._agents(agent_name, wanted) if agent_name else None
        if agent is None:
            ending = TurnEnding(
                "failed", "agent_not_found", error=f"agent {agent_name or '?'} is not served here"
            )
            return await _end(sink, turn, ending, _aborted(sink))
        if turn.agent is not None and turn.agent.fingerprint != agent.fingerprint:
            # Another definition under the same name (a process started from other code): the
            # turn was submitted for a template this process does not have. Running this one
            # would answer with instructions or tools the caller never chose.
            log.warning(
                "turn %s was submitted for agent %s %s; this process serves %s",
                turn.id,
                agent.name,
                turn.agent.fingerprint,
                agent.fingerprint,
            )
            ending = TurnEnding(
                "failed",
                "agent_changed",
                error=f"agent {agent.name} is defined differently here than where it was sent",
            )
            return await _end(sink, turn, ending, _aborted(sink))
        # Memory and knowledge are the conversation's: set by the agent the turn was sent to
        # (a Session's options live there), whichever agent a handoff passed it to.
        policy = agent.memory
        if agent.handoffs:
            agent = await self._handed_to(turn, agent)
        try:
            ctx, memory = self._context(sink, turn, agent, user_item, policy)
        except Exception as exc:
            return await _end(sink, turn, _set_up_failed(turn, agent, exc), _aborted(sink))
        ctx.resumed = resumed
        if agent.mcp and self.mcp is not None:
            # The session's MCP servers, started by its first turn that needs them. (An agent a
            # handoff passes the turn to offers its MCP tools from its next turn on.)
            taken = {t.name for t in ctx.tools} | {h.tool_name for h in agent.handoffs}
            ctx.extra_tools += await self.mcp.tools(
                agent.mcp, turn.key, ctx.principal, ctx.workspace, taken=taken
            )
        asks = any(t.requires_approval for t in ctx.tools)
        if resumed is not None or asks or agent.handoffs or agent.skills:
            # Read only when it can matter: most turns have no tool that asks and no skills (an
            # agent that hands off may pass the turn to one whose tools do, or that has skills).
            record = await self._store.get_session(turn.key)
            state = record.state if record is not None else {}
            ctx.always = always_approved(state)
            ctx.skills = SessionSkills(self._store, sink.lease, lambda: ctx.agent, state)
        if memory is not None and held is not None:
            memory.restore(held)
        self._local.running[turn.id] = RunningTurn(turn, ctx)
        try:
            await self._asked_meanwhile(turn, ctx, rings)
            result = await run_turn(ctx)
        finally:
            self._local.running.pop(turn.id, None)
        writes = memory.pending() if memory is not None else None
        if isinstance(result, TurnPark):
            decision = new_decision(turn.key, turn.id, result.decision, time.time())
            return await sink.park(result.items, decision, result.usage, writes)
        return await _ended(ctx, sink, turn, result, writes)

    async def _handed_to(self, turn: Turn, agent: Agent) -> Agent:
        """The agent the session's conversation was last handed to, when ``agent`` can reach it
        through its handoffs (then that agent runs the turn, until it hands on or back);
        otherwise ``agent`` itself."""
        last = await self._store.latest_handoff(turn.key)
        if last is None or last.content == agent.name:
            return agent
        return reachable(agent, self._agents).get(last.content, agent)

    def _context(
        self, sink: FencedSink, turn: Turn, agent: Agent, user_item: Item, policy: MemoryPolicy
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
            history=CachedHistory(self._store, self._local.history, sink.lease),
            sink=sink,
            memo=self._local.history.memo(sink.lease),
            workspace=workspace_dir(self.workspace_root, key) if self.workspace_root else None,
            workspace_quota=self.workspace_quota,
        )
        ctx.extra_tools = self._builtin_tools(agent, policy)
        ctx.hand_to = lambda h: self._switch_to(h, policy)
        ctx.can_hand_to = lambda h: resolve_target(h, self._agents) is not None
        if self.memory is None:
            return ctx, None
        # Memory belongs to the session's owner (embedded use may act for a user_id other than
        # the caller's principal), with the caller's roles. It is the turn's: after a handoff
        # the turn keeps the memory (and the recall) it started with.
        owner = Principal(key.tenant, key.owner, ctx.principal.roles)
        auto = notes_wanted(self.auto_notes, policy.auto, ctx.model.name)
        memory = TurnMemory(self.memory, owner, key, agent.name, policy, turn.id, auto)
        ctx.memory = memory
        return ctx, memory

    def _builtin_tools(self, agent: Agent, policy: MemoryPolicy) -> tuple[Tool, ...]:
        """``ask_user`` and ``activate_skill`` (the agent's), and the memory tools the turn's
        memory policy turns on."""
        builtin: tuple[Tool, ...] = (ask_user,) if agent.ask_user else ()
        if agent.skills:
            builtin += (activate_skill,)
        if self.memory is None:
            return builtin
        return builtin + memory_tools(policy.remember, policy.knowledge_tool)

    def _switch_to(self, target: Handoff, policy: MemoryPolicy) -> Switch | None:
        """What the rest of a turn runs after a handoff to ``target``; None if not served."""
        agent = resolve_target(target, self._agents)
        if agent is None:
            return None
        model = resolve_model(agent.model if agent.model is not None else self.default_model)
        return Switch(agent, model, self._builtin_tools(agent, policy))


async def _ended(
    ctx: TurnContext, sink: FencedSink, turn: Turn, result: TurnResult, writes: MemoryWrites | None
) -> Turn:
    """Write how the turn ended, with the agent it ended with (after any handoff)."""
    ending = replace(result.ending, agent=ctx.agent.name)
    if isinstance(ctx.skills, SessionSkills) and not keeps_memory(ending.status):
        # Before the ending: a process lost in between leaves a failed turn either way.
        await ctx.skills.undo()
    return await _end(sink, turn, ending, result.items, writes)


def _set_up_failed(turn: Turn, agent: Agent, exc: Exception) -> TurnEnding:
    """How a turn whose context could not be made ends: at once, saying why, rather than with
    its worker and then as ``owner_lost`` when the lease ran out, as if its process had died."""
    if isinstance(exc, ConfigError):
        # Its model cannot be made (an API key missing, say).
        log.warning("turn %s: agent %s's model cannot run: %s", turn.id, agent.name, exc)
        return TurnEnding("failed", "model_error", error=str(exc))
    # A fault of ours, or of what the app gave the runtime.
    log.error("turn %s: internal error setting it up", turn.id, exc_info=exc)
    return TurnEnding("failed", "internal_error", error=internal_error_message(exc))


def _aborted(sink: FencedSink) -> list[NewItem]:
    """Results for the calls a turn ended with open (a resumed turn that cannot go on)."""
    return aborted_results(sink.open_calls())


async def _end(
    sink: FencedSink,
    turn: Turn,
    ending: TurnEnding,
    items: list[NewItem],
    memory: MemoryWrites | None = None,
) -> Turn:
    return await sink.end(ending, items, terminal_event_data(turn.id, ending), memory)
