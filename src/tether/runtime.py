"""A store, a scheduler and the agents they serve, on one event loop.

The server owns one inside its lifespan; embedded use (``Agent.chat`` in a script) gets a
process-wide one on a background thread (see :mod:`tether.embedded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from tether.agent import Agent
from tether.errors import (
    AgentNotFound,
    ConfigError,
    DecisionMade,
    DecisionRequired,
    SessionNotFound,
    TetherError,
    TurnFailed,
)
from tether.events import TURN_ENDED
from tether.keys import ApiKeys
from tether.memory.embed import Embedder, embedder_from_env
from tether.memory.service import MemoryService
from tether.models import close_models
from tether.records import (
    LOCAL_PRINCIPAL,
    Decision,
    DecisionStatus,
    Event,
    ForgetReport,
    Policy,
    Principal,
    PrincipalLimits,
    SessionKey,
    SessionRecord,
    Turn,
    Verdict,
)
from tether.reply import Response
from tether.scheduler import Scheduler
from tether.scheduler.runner import AutoNotes, auto_notes_from_env
from tether.scheduler.sessions import SessionService
from tether.store.capabilities import OwnThread
from tether.store.protocol import Store
from tether.store.rules import DEFAULT_MAX_QUEUE
from tether.store.sqlite import SQLiteStore
from tether.tools.approval import ApprovalRequest, Approver
from tether.tools.mcp import McpSessions
from tether.tools.workspace import discard_owner, quota_from_env, root_for

log = logging.getLogger("tether.runtime")

DecisionAnswer = bool | str | None
"""What an ``on_decision`` callback returns. For an approval: True or ``"approve"``, False or
``"deny"``, ``"always"``; for a question: the answer's text, or False to decline. None: this
callback cannot decide it (the caller then gets :class:`DecisionRequired`)."""
OnDecision = Callable[[Decision], DecisionAnswer | Awaitable[DecisionAnswer]]
"""Decides what a turn asks (sync or async). An exception refuses: it fails closed."""


def default_data_dir() -> Path:
    """``TETHER_DATA_DIR``, else ``./.tether``."""
    return Path(os.environ.get("TETHER_DATA_DIR") or ".tether")


class Runtime:
    def __init__(
        self,
        store: Store | None = None,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        agents: list[Agent] | None = None,
        lease_ttl: float = 30.0,
        node: str | None = None,
        approver: Approver | None = None,
        on_decision: OnDecision | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        default_model: str | None = None,
        embedder: Embedder | str | None = None,
        auto_notes: AutoNotes | None = None,
        limits: PrincipalLimits | None = None,
        workspace_quota: int | None = None,
        workspace_root: str | os.PathLike[str] | None = None,
        mcp: McpSessions | None = None,
    ) -> None:
        # A str is as good as a Path here, as everywhere a path is taken.
        self.data_dir = Path(data_dir) if data_dir else default_data_dir()
        self.workspace_root = Path(workspace_root) if workspace_root else root_for(self.data_dir)
        """Every session's workspace lives under it (:mod:`tether.tools.workspace`): given,
        else ``TETHER_WORKSPACE_ROOT``, else ``<data_dir>/workspaces``."""
        self.default_model = default_model
        self.mcp = mcp if mcp is not None else McpSessions()
        """The sessions' MCP servers in this process (idle timeout, bound, sandbox wrap);
        closed with their sessions and with the runtime."""
        self.store: Store = store or SQLiteStore(self.data_dir / "tether.db")
        self.agents: dict[str, Agent] = {}
        """The first definition of each name: what a name alone means (HTTP, ``served``)."""
        self._definitions: dict[tuple[str, str], Agent] = {}
        for agent in agents or []:
            self.register(agent)
        self.memory = MemoryService(self.store, embedder=embedder or embedder_from_env())
        self.scheduler: Scheduler = Scheduler(
            self.store,
            self.resolve,
            lease_ttl=lease_ttl,
            node=node,
            workspace_root=self.workspace_root,
            workspace_quota=workspace_quota if workspace_quota is not None else quota_from_env(),
            max_queue=max_queue,
            default_model=default_model,
            memory=self.memory,
            auto_notes=auto_notes or auto_notes_from_env(),
            limits=limits,
            mcp=self.mcp,
        )
        self.on_decision: OnDecision | None = on_decision or (
            _from_approver(approver) if approver is not None else None
        )
        """What ``chat`` decides with when the caller passes no ``on_decision`` of its own."""
        self.sessions = SessionService(
            self.store,
            self.scheduler,
            max_sessions=limits.sessions if limits else None,
            workspace_root=self.workspace_root,
            mcp=self.mcp,
            noted=self.scheduler.noted,
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

    def store_thread(self) -> int | None:
        """The native id of the thread the store runs its calls on (SQLite's), which a server
        pins beside its event loop (:mod:`tether.affinity`); None for a store without one, or
        not open."""
        store = self.store
        return store.thread_id() if isinstance(store, OwnThread) else None

    async def warmed(self) -> None:
        """Return once the embedder has loaded (at once when it has, or is not loading)."""
        warming = self._warming
        if warming is not None:
            await asyncio.shield(warming)

    async def close(self, drain_timeout: float = 10.0) -> None:
        if not self._started:
            return
        self._started = False
        self._starting = None
        if self._warming is not None:
            await self._warming
            self._warming = None
        await self.scheduler.close(drain_timeout)
        await self.mcp.close()  # after the turns: none starts a server again
        # The model clients' pooled connections belong to this loop: closed here, or they are
        # garbage (unclosed sockets) when the loop is gone.
        await close_models([a.model for a in self.agents.values()] + [self.default_model])
        await self.memory.close()
        await self.store.close()

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def register(self, agent: Agent) -> None:
        """Serve ``agent`` under its name, and the agents it hands off to under theirs.

        A turn runs exactly the definition it was submitted for, so several definitions may
        share a name (sessions with other memory options, a notebook cell edited and run
        again); a name given alone (``served``, an HTTP request) means the first one. The same
        definition registers again as a no-op. What cannot be told apart is refused with a
        :class:`ConfigError`: a definition alike in every way but a model given as another
        object (two endpoints behind one model name, say) would run the other's turns.
        """
        # The agents it hands off to are served with it: a transfer must find its target.
        closure = (agent, *agent.handoff_agents())
        for one in closure:
            known = self._definitions.get((one.name, one.fingerprint))
            if known is not None and not known.same_definition(one):
                raise ConfigError(
                    f"an agent named {one.name!r} is already served with a definition alike "
                    "but for its model object (or its tools' code); pass the very same model "
                    "object again, use a model spec string, or give this agent its own name"
                )
        for one in closure:
            self._definitions.setdefault((one.name, one.fingerprint), one)
            self.agents.setdefault(one.name, one)

    def resolve(self, name: str, fingerprint: str | None = None) -> Agent | None:
        """The definition ``fingerprint`` of the agent ``name`` when it is served here, else the
        agent served under ``name`` (the scheduler then checks it is the one a turn wants)."""
        if fingerprint:
            exact = self._definitions.get((name, fingerprint))
            if exact is not None:
                return exact
        return self.agents.get(name)

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
        report = await self.memory.forget_user(tenant, user)
        await self.mcp.close_owner(tenant, user)
        await discard_owner(self.workspace_root, tenant, user)  # after the rows: none is made anew
        return report

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
        if key.owner != principal.user:
            # A Session(user_id=…)'s turns are that user's: its tools (ctx.principal) and MCP
            # servers' headers see the user, not the process that sent them (its roles stay:
            # the app itself sent the turn).
            principal = Principal(principal.tenant, key.owner, principal.roles)
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
        on_decision: OnDecision | None = None,
    ) -> Response:
        """Run one turn and return its complete reply: a ``str`` that also carries the turn's
        ``metadata`` (``agent_name`` — the agent that answered —, ``turn_id``, ``status``…).

        What the turn asks a human (a tool approval, ``ask_user``, going on past the iteration
        limit) goes to ``on_decision`` (else the runtime's); with neither, the turn stays
        parked and :class:`DecisionRequired` carries the decision: decide it with
        :meth:`decide` and :meth:`settle` the turn.
        """
        turn = await self.submit(
            agent,
            message,
            session_id=session_id,
            policy=policy,
            principal=principal,
            idempotency_key=idempotency_key,
        )
        done = await self.settle(turn, on_decision, principal=principal)
        if done.status != "completed":
            raise TurnFailed(done)
        return Response.of_turn(done)

    async def settle(
        self,
        turn: Turn,
        on_decision: OnDecision | None = None,
        *,
        principal: Principal = LOCAL_PRINCIPAL,
    ) -> Turn:
        """Wait for the turn to end, deciding on the way what it asks with ``on_decision``
        (else the runtime's). DecisionRequired when nobody here can decide."""
        decider = on_decision or self.on_decision
        while True:
            done = await self.wait_or_cancel(turn, until_input=True)
            if done.ended:
                return done
            # Its own decision, or (queued) that of the earlier turn it waits behind: the same
            # owner's session, and nothing of it runs until that one is decided.
            ahead = await self.scheduler.parked_ahead(done)
            asking = ahead.id if ahead is not None else turn.id
            for d in await self.scheduler.decisions(turn.key, turn_id=asking, status="pending"):
                verdict = await _ask(decider, d) if decider is not None else None
                if verdict is None:
                    raise DecisionRequired(d, done)
                try:
                    await self.scheduler.decide(
                        turn.key,
                        d.turn_id,
                        d.call_id,
                        verdict[0],
                        answer=verdict[1],
                        by=principal.user,
                    )
                except DecisionMade:
                    pass  # decided elsewhere meanwhile: that decision stands
                except TetherError:
                    # The callback's answer does not fit (an answer outside the choices):
                    # refuse rather than leave the turn waiting on a caller who answered.
                    log.warning("on_decision gave %r for %s; refusing", verdict, d.call_id)
                    await self._refuse(d, principal)

    async def _refuse(self, d: Decision, principal: Principal) -> None:
        with contextlib.suppress(DecisionMade):
            await self.scheduler.decide(d.key, d.turn_id, d.call_id, "deny", by=principal.user)

    async def decide(
        self,
        key: SessionKey,
        turn_id: str,
        call_id: str,
        verdict: Verdict,
        *,
        answer: str | None = None,
        principal: Principal = LOCAL_PRINCIPAL,
    ) -> Decision:
        """Decide what a parked turn of ``key`` asks; the turn then goes on (DESIGN §7)."""
        await self.start()
        return await self.scheduler.decide(
            key, turn_id, call_id, verdict, answer=answer, by=principal.user, principal=principal
        )

    async def decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
    ) -> list[Decision]:
        await self.start()
        return await self.scheduler.decisions(key, turn_id=turn_id, status=status)

    async def wait_or_cancel(self, turn: Turn, *, until_input: bool = False) -> Turn:
        """Wait for the turn; if the caller gives up (is cancelled), cancel the turn too."""
        try:
            return await self.scheduler.wait(turn.key, turn.id, until_input=until_input)
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


async def _ask(decider: OnDecision, d: Decision) -> tuple[Verdict, str | None] | None:
    """What ``decider`` says to ``d``, as a verdict and answer; None when it cannot say.

    It fails closed: a callback that raises refuses.
    """
    try:
        if inspect.iscoroutinefunction(decider):
            said = await decider(d)
        else:
            # A sync callback may block (input(), a GUI): never on the runtime's event loop.
            said = await asyncio.to_thread(decider, d)
            if inspect.isawaitable(said):
                said = await said
    except Exception:
        log.warning("on_decision raised for %s; refusing", d.call_id, exc_info=True)
        return "deny", None
    return verdict_of(d, said)


def verdict_of(d: Decision, said: DecisionAnswer) -> tuple[Verdict, str | None] | None:
    """A callback's answer as a verdict: see :data:`DecisionAnswer`."""
    if said is None:
        return None
    if said is False or not isinstance(said, str | bool):
        # Not an answer at all (a number, a dict): refused, as a callback that raised is.
        return "deny", None
    if d.kind == "question":
        if said is True:
            return "deny", None  # a yes is no answer to a question
        return "answer", said
    if said is True:
        return "approve", None
    word = said.strip().lower()
    if word in ("approve", "approved", "yes", "y"):
        return "approve", None
    if word == "always":
        return "always", None
    return "deny", None  # anything else refuses: fail closed


def _from_approver(approver: Approver) -> OnDecision:
    """An old-style approver (``ApprovalRequest`` → bool) as an ``on_decision``: it decides
    approvals; questions are left to the caller."""

    async def decide(d: Decision) -> DecisionAnswer:
        if d.kind != "approval" or not d.payload.get("tool"):
            return None
        request = ApprovalRequest(
            d.key, d.turn_id, d.call_id, str(d.payload["tool"]), str(d.payload.get("arguments"))
        )
        return (await approver(request)) is True

    return decide
