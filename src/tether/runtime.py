"""A store, a scheduler and the agents they serve, on one event loop.

The server owns one inside its lifespan; embedded use (``Agent.chat`` in a script) gets a
process-wide one on a background thread (see :mod:`tether.embedded`).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import AsyncIterator
from pathlib import Path

from tether.agent import Agent
from tether.errors import AgentNotFound, ConfigError, SessionNotFound, TurnFailed
from tether.events import TURN_ENDED
from tether.keys import ApiKeys
from tether.memory.embed import Embedder
from tether.memory.service import MemoryService
from tether.records import (
    LOCAL_PRINCIPAL,
    Event,
    ForgetReport,
    Policy,
    Principal,
    PrincipalLimits,
    SessionKey,
    SessionRecord,
    Turn,
)
from tether.scheduler import Scheduler
from tether.scheduler.runner import AutoNotes, auto_notes_from_env
from tether.scheduler.sessions import SessionService
from tether.store.protocol import Store
from tether.store.rules import DEFAULT_MAX_QUEUE
from tether.store.sqlite import SQLiteStore
from tether.tools.approval import Approver


def default_data_dir() -> Path:
    """``TETHER_DATA_DIR``, else ``./.tether``."""
    return Path(os.environ.get("TETHER_DATA_DIR") or ".tether")


class Runtime:
    def __init__(
        self,
        store: Store | None = None,
        *,
        data_dir: Path | None = None,
        agents: list[Agent] | None = None,
        lease_ttl: float = 30.0,
        node: str | None = None,
        approver: Approver | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        default_model: str | None = None,
        embedder: Embedder | str | None = None,
        auto_notes: AutoNotes | None = None,
        limits: PrincipalLimits | None = None,
    ) -> None:
        self.data_dir = data_dir or default_data_dir()
        self.store: Store = store or SQLiteStore(self.data_dir / "tether.db")
        self.agents: dict[str, Agent] = {}
        for agent in agents or []:
            self.register(agent)
        self.memory = MemoryService(
            self.store, embedder=embedder or os.environ.get("TETHER_EMBEDDER") or None
        )
        self.scheduler: Scheduler = Scheduler(
            self.store,
            self.agents.get,
            lease_ttl=lease_ttl,
            node=node,
            workspace_root=self.data_dir / "workspaces",
            approver=approver,
            max_queue=max_queue,
            default_model=default_model,
            memory=self.memory,
            auto_notes=auto_notes or auto_notes_from_env(),
            limits=limits,
        )
        self.sessions = SessionService(
            self.store, self.scheduler, max_sessions=limits.sessions if limits else None
        )
        """Sessions for every front door: the caller's own, cancel-then-delete."""
        self.keys = ApiKeys(self.store)
        self._started = False
        self._starting: asyncio.Future[None] | None = None
        self._warming: asyncio.Future[None] | None = None

    async def start(self) -> None:
        # Many first calls may arrive at once; they must share one start, not race to start
        # several schedulers on one store.
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        await self.store.open()
        # The embedder loads alongside (under a second); the first turn that recalls waits for
        # it only if it comes sooner.
        self._warming = asyncio.ensure_future(self.memory.warm())
        await self.scheduler.start()
        self._started = True

    async def close(self, drain_timeout: float = 10.0) -> None:
        if not self._started:
            return
        self._started = False
        self._starting = None
        if self._warming is not None:
            await self._warming
            self._warming = None
        await self.scheduler.close(drain_timeout)
        await self.memory.close()
        await self.store.close()

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def register(self, agent: Agent) -> None:
        """Serve ``agent`` under its name.

        A name stands for one template in a runtime: registering the same definition again is
        a no-op, another definition under a taken name is a :class:`ConfigError` (it would
        otherwise run turns submitted for the first, or take over its sessions).
        """
        known = self.agents.get(agent.name)
        if known is None:
            self.agents[agent.name] = agent
        elif not known.same_definition(agent):
            raise ConfigError(
                f"an agent named {agent.name!r} is already served with another definition; "
                "give this one its own name (a model given as an object counts as the same "
                "only when it is the very same object: pass it again, or use a spec string)"
            )

    def served(self, name: str) -> Agent:
        """The agent served under ``name``; AgentNotFound names the ones that are."""
        agent = self.agents.get(name)
        if agent is None:
            known = list(self.agents)  # in the order they were registered, as GET /v1/agents
            raise AgentNotFound(
                f"no agent named {name!r}; this server runs: {', '.join(known) or 'no agents'}",
                known=known,
            )
        return agent

    async def ping(self) -> None:
        """Raise :class:`StoreError` when the store cannot answer (readiness)."""
        await self.store.ping()

    async def get_session(self, key: SessionKey) -> SessionRecord | None:
        """The session as stored (started first: embedded callers may come before any turn)."""
        await self.start()
        return await self.sessions.get(key)

    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        """Everything of one user, gone: their turns are cancelled (and waited for, so none
        writes after its data is gone), then sessions, history, memory and knowledge are
        deleted in one transaction. Shared (agent, tenant) memory stays."""
        await self.sessions.cancel_all_of(tenant, user, "user_data_deleted")
        return await self.memory.forget_user(tenant, user)

    async def ensure_session(
        self, key: SessionKey, agent: str, *, ttl_seconds: float | None = None
    ) -> SessionRecord:
        await self.start()
        record, _ = await self.sessions.create(key, agent, ttl_seconds=ttl_seconds, exist_ok=True)
        return record

    def key_for(self, agent: Agent, session_id: str | None, principal: Principal) -> SessionKey:
        owner = agent.memory.user_id or principal.user
        return SessionKey.of(
            Principal(principal.tenant, owner, principal.roles), session_id or agent.session_id
        )

    async def submit(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None = None,
        policy: Policy = "enqueue",
        principal: Principal = LOCAL_PRINCIPAL,
        idempotency_key: str | None = None,
    ) -> Turn:
        await self.start()
        self.register(agent)
        ref = agent.ref
        key = self.key_for(agent, session_id, principal)
        # In-process callers wait for room in the queue instead of failing at its bound.
        wait = math.inf if policy == "enqueue" else 0.0
        try:
            # Most turns land on a session that exists: try that first, and create the
            # session only when the store says it is not there (saves a write per turn).
            return await self.scheduler.submit(
                key,
                message,
                policy=policy,
                principal=principal,
                wait_for_slot=wait,
                agent=ref,
                idempotency_key=idempotency_key,
            )
        except SessionNotFound:
            record, created = await self.sessions.create(
                key, agent.name, ttl_seconds=agent.memory.session_ttl, exist_ok=True
            )
            if not created and record.expired():
                raise
        return await self.scheduler.submit(
            key,
            message,
            policy=policy,
            principal=principal,
            wait_for_slot=wait,
            agent=ref,
            idempotency_key=idempotency_key,
        )

    async def chat(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None = None,
        policy: Policy = "enqueue",
        principal: Principal = LOCAL_PRINCIPAL,
        idempotency_key: str | None = None,
    ) -> str:
        turn = await self.submit(
            agent,
            message,
            session_id=session_id,
            policy=policy,
            principal=principal,
            idempotency_key=idempotency_key,
        )
        done = await self.wait_or_cancel(turn)
        if done.status != "completed":
            raise TurnFailed(done)
        return done.output or ""

    async def wait_or_cancel(self, turn: Turn) -> Turn:
        """Wait for the turn; if the caller gives up (is cancelled), cancel the turn too."""
        try:
            return await self.scheduler.wait(turn.key, turn.id)
        except BaseException:
            await self.scheduler.cancel(turn.key, turn.id, "caller_cancelled")
            raise

    async def stream(
        self,
        agent: Agent,
        message: str,
        *,
        session_id: str | None = None,
        policy: Policy = "enqueue",
        principal: Principal = LOCAL_PRINCIPAL,
    ) -> AsyncIterator[Event]:
        turn = await self.submit(
            agent, message, session_id=session_id, policy=policy, principal=principal
        )
        finished = False
        try:
            async for event in self.scheduler.events(turn.key, turn.id):
                yield event
                if event.type == TURN_ENDED:
                    finished = True
        finally:
            if not finished:
                await self.scheduler.cancel(turn.key, turn.id, "caller_cancelled")
