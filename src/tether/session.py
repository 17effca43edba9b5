"""``Session``: one conversation as an object, embedded or on a remote server.

::

    session = Session(session_id="chat_123", user_id="user_456", session_ttl=3600)
    helper = session.Agent(name="Assistant", instructions="…")
    helper.chat("…")                      # history persists under the data directory
    session.add_memory("Prefers metric units"); session.search_memory("units")
    session.add_knowledge("handbook.pdf"); session.search_knowledge("holiday policy")
    session.save_state({"step": 2}); session.restore_state()
    session.is_expired(); session.time_to_expiry()
    session.close()                       # this object is done; the conversation stays stored

    remote = Session(agent_url="http://host:8000", timeout=30)
    remote.chat("hi")                     # TimeoutError / ConnectionError on transport trouble

    session.chat("deploy it", on_decision=lambda d: input(f"{d.payload}? ") == "y")
    try:                                  # or: nobody to ask now, decide later (any process)
        session.chat("deploy it")
    except DecisionRequired as waiting:
        reply = session.decide(waiting.decision, "approve")   # or answer="…" for ask_user
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tether import _wire
from tether.agent import Agent as AgentTemplate
from tether.agent import MemoryPolicy
from tether.embedded import EmbeddedRuntime, default_runtime
from tether.errors import (
    ConfigError,
    DecisionNotFound,
    MiddlewareFailed,
    SessionClosed,
    SessionNotFound,
    SyncInAsyncContext,
    TetherError,
    TurnFailed,
)
from tether.records import (
    Decision,
    DecisionStatus,
    Hit,
    Item,
    Principal,
    SessionKey,
    SessionRecord,
    Turn,
    Verdict,
    new_session_id,
    validate_session_id,
)
from tether.reply import Response
from tether.runtime import OnDecision
from tether.session_options import (
    DEFAULT_COLLECTION,
    checked_ttl,
    collection_of,
    memory_options,
    server_of,
)
from tether.store.rules import ALWAYS_KEY

if TYPE_CHECKING:
    from tether.client import AsyncClient

NO_AGENT = ""
"""The agent a session is created with when state or memory comes before any agent: none. A
session's agent is only the default for turns that name none, and every turn of this facade
names its own, so nothing is bound to an agent nobody made (the store keeps a name, not NULL)."""
CLOSE_WAIT = 30.0
"""Seconds ``close()`` waits for a turn of the session still under way before cancelling it."""
CONTEXT_PAGE = 200
"""Items read per step when ``get_context`` pages backwards from the newest."""
T = TypeVar("T")


class Session:
    def __init__(
        self,
        session_id: str | None = None,
        user_id: str | None = None,
        session_ttl: float | None = None,
        *,
        agent_url: str | None = None,
        timeout: float = 30.0,
        headers: dict[str, str] | None = None,
        api_key: str | None = None,
        agent_name: str | None = None,
        middleware: Sequence[Middleware] = (),
        memory: bool | dict[str, Any] | MemoryPolicy | None = None,
        knowledge: bool | dict[str, Any] | None = None,
    ) -> None:
        self.session_id = validate_session_id(session_id) if session_id else new_session_id()
        if callable(middleware) or isinstance(middleware, str | bytes | Mapping):
            raise ConfigError("middleware takes a list of functions (message, response)")
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        self._memory = memory_options(memory)
        """Memory options every agent of the session starts from (its own ``memory=`` adds)."""
        self.collection: str | None = collection_of(knowledge)
        """The knowledge collection the session adds to and its agents read (None: none)."""
        for fn in self.middleware:
            if not callable(fn):
                raise ConfigError(f"middleware must be functions (message, response), not {fn!r}")
        if user_id is not None and not _good_user_id(user_id):
            raise ConfigError(
                "user_id must be 1-256 printable characters, no surrounding spaces (it names "
                "the owner of the session's history and memory)"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, not {timeout!r}")
        if headers is not None and (
            not isinstance(headers, Mapping)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise ConfigError("headers must be a dict of header names to text values")
        self.user_id = user_id or "local"
        self.session_ttl = checked_ttl(session_ttl)
        self.agent_url = agent_url
        if agent_url:
            # The remote-agent contract names an agent's URL (…/agent, …/agents/<name>); the
            # client talks to the server it lives on.
            agent_url, named = server_of(agent_url)
            agent_name = agent_name or named
        self._server_url = agent_url
        self.agent_name = agent_name
        self._agent: AgentTemplate | None = None
        self._agents: dict[str, AgentTemplate] = {}
        """Every agent made here, by name (the latest of a name), in the order first made:
        what ``save_state()`` records of the session's agents."""
        self._closed = False
        self._used = False  # whether this object reached the embedded runtime (close() looks)
        if agent_url:
            from tether.client import Client

            self._client: Client | None = Client(
                agent_url, api_key=api_key, timeout=timeout, headers=headers
            )
            self._aclient_args: dict[str, Any] = {
                "api_key": api_key,
                "timeout": timeout,
                "headers": headers,
            }
            self._async_client_type = _async_client_class()
        else:
            self._client = None

    # -- where it lives --------------------------------------------------------------------------
    @property
    def is_remote(self) -> bool:
        return self.agent_url is not None

    @property
    def key(self) -> SessionKey:
        return SessionKey.of(Principal("local", self.user_id), self.session_id)

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(
                f"session {self.session_id!r} was closed; its conversation stays stored, "
                f"open it again with Session(session_id={self.session_id!r}, ...)"
            )

    def _rt(self) -> EmbeddedRuntime:
        self._check_open()
        if self.is_remote:
            raise ConfigError("this is a remote session: state lives on the server")
        self._used = True
        return default_runtime()

    def _record(self) -> SessionRecord | None:
        rt = self._rt()
        record: SessionRecord | None = rt.call(rt.runtime.get_session(self.key))
        return record

    def _ensure(self, agent_name: str) -> SessionRecord:
        rt = self._rt()
        record: SessionRecord = rt.call(
            rt.runtime.ensure_session(self.key, agent_name, ttl_seconds=self.session_ttl)
        )
        return record

    # -- agents and chat -------------------------------------------------------------------------
    def Agent(
        self, name: str, instructions: str = "You are a helpful assistant.", **options: Any
    ) -> AgentTemplate:
        """An agent whose conversation is this session (PraisonAI's ``session.Agent``).

        ``memory=True`` (or a dict, or a ``MemoryConfig``) and ``knowledge=True`` (or collection
        names) are accepted as documented; the session sets the ids. Its replies pass through
        the session's middleware.
        """
        self._check_open()
        if self.is_remote:
            # Its agents are the server's: an agent made here would run on the local store.
            raise ConfigError(
                "a remote session's agents are the server's: use session.chat(...) "
                "(Session(agent_url=…/agents/<name>) talks to one of them by name)"
            )
        extra = {**self._memory, **memory_options(options.pop("memory", None))}
        knowledge = options.pop("knowledge", None)
        if knowledge is False:
            extra["knowledge"] = []
        elif isinstance(knowledge, str):
            extra["knowledge"] = [knowledge]
        elif isinstance(knowledge, list | tuple):
            extra["knowledge"] = [str(k) for k in knowledge]
        agent = SessionAgent(
            name=name,
            instructions=instructions,
            memory={
                "session_id": self.session_id,
                "user_id": self.user_id,
                "session_ttl": self.session_ttl,
                # A Session names its user, so its memory and knowledge follow that user.
                "scopes": ["session", "user", "agent", "tenant"],
                "knowledge": [self.collection] if self.collection else [],
                **extra,
            },
            **options,
        )
        object.__setattr__(agent, "_session", self)
        self._agent = self._agents[name] = agent
        self._used = True  # its turns run on the embedded runtime: close() waits for them
        return agent

    def after_turn(self, message: str, reply: str) -> str:
        """Run the session's middleware over a reply, in order (a coroutine's result is awaited
        on a loop of its own: this is the blocking path)."""
        for fn in self.middleware:
            try:
                out = fn(message, reply)
                if inspect.isawaitable(out):
                    out = asyncio.run(_awaited(out))
            except Exception as exc:
                raise MiddlewareFailed(fn, reply) from exc
            reply = str(out)
        return reply

    async def aafter_turn(self, message: str, reply: str) -> str:
        for fn in self.middleware:
            try:
                out = fn(message, reply)
                if inspect.isawaitable(out):
                    out = await out
            except Exception as exc:
                raise MiddlewareFailed(fn, reply) from exc
            reply = str(out)
        return reply

    def _chat_agent(self) -> AgentTemplate:
        """The agent ``chat`` talks to: the latest made here, else one named ``agent_name``
        (or ``assistant``) with the default instructions — a real agent that takes the turn."""
        if self._agent is None:
            self._agent = self.Agent(name=self.agent_name or "assistant")
        return self._agent

    def _named_agent(self) -> str | None:
        """The agent this session has been given so far (the latest ``session.Agent``, else
        ``agent_name``), or None: calls that run no turn never make one up."""
        return self._agent.name if self._agent is not None else self.agent_name

    def chat(
        self,
        message: str,
        *,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        """One turn with this session's agent (or the remote server's).

        What the turn asks a human (a tool approval, ``ask_user``) goes to ``on_decision``
        (sync or async; see :data:`tether.runtime.DecisionAnswer`). Without one,
        :class:`~tether.errors.DecisionRequired` carries the decision and the turn waits:
        :meth:`decide` it and get the reply. A retry with the same ``idempotency_key`` gets
        the turn the first call made, never a second one (a remote call that timed out, say).
        """
        self._check_open()
        if self._client is not None:
            reply = self._client.chat(
                message,
                session_id=self.session_id,
                agent_name=self.agent_name,
                on_decision=on_decision,
                idempotency_key=idempotency_key,
            )
            return Response.of_reply(reply, self.after_turn(message, str(reply["response"])))
        agent = self._chat_agent()
        self._check_alive(self._ensure(agent.name))
        return agent.chat(message, on_decision=on_decision, idempotency_key=idempotency_key)

    async def achat(
        self,
        message: str,
        *,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        """See :meth:`chat`."""
        self._check_open()
        if self.is_remote:
            async with self._async_client() as client:
                reply = await client.chat(
                    message,
                    session_id=self.session_id,
                    agent_name=self.agent_name,
                    on_decision=on_decision,
                    idempotency_key=idempotency_key,
                )
            text = await self.aafter_turn(message, str(reply["response"]))
            return Response.of_reply(reply, text)
        agent = self._chat_agent()
        rt = self._rt()
        record = await rt.acall(
            rt.runtime.ensure_session(self.key, agent.name, ttl_seconds=self.session_ttl)
        )
        self._check_alive(record)
        return await agent.achat(message, on_decision=on_decision, idempotency_key=idempotency_key)

    def _async_client(self) -> AsyncClient:
        assert self._server_url is not None
        return self._async_client_type(self._server_url, **self._aclient_args)

    # -- decisions -------------------------------------------------------------------------------
    def decisions(self, status: DecisionStatus | None = "pending") -> list[Decision]:
        """This session's decisions, oldest first: by default those waiting for a human now
        (``status=None``: all of them)."""
        self._check_open()
        if self._client is not None:
            return self._client.decisions(self.session_id, status=status)
        rt = self._rt()
        try:
            found: list[Decision] = rt.call(rt.runtime.decisions(self.key, status=status))
        except SessionNotFound:
            return []  # not stored yet (no chat so far), or expired: nothing to decide
        return found

    async def adecisions(self, status: DecisionStatus | None = "pending") -> list[Decision]:
        """See :meth:`decisions`."""
        self._check_open()
        if self.is_remote:
            async with self._async_client() as client:
                return await client.decisions(self.session_id, status=status)
        rt = self._rt()
        try:
            found: list[Decision] = await rt.acall(rt.runtime.decisions(self.key, status=status))
        except SessionNotFound:
            return []
        return found

    def decide(
        self,
        decision: Decision | str,
        verdict: Verdict | None = None,
        answer: str | None = None,
        *,
        on_decision: OnDecision | None = None,
    ) -> Response:
        """Decide what a waiting turn asks (a :class:`Decision`, or its ``call_id``) and get the
        turn's reply once it ends, through the session's middleware as ``chat``'s is.

        ``verdict`` is approve (the default), deny or always for an approval; a question is
        answered with ``answer`` (the verdict is then ``answer``). What the turn asks next goes
        to ``on_decision``, else :class:`~tether.errors.DecisionRequired` again;
        :class:`~tether.errors.TurnFailed` when the turn does not complete.
        """
        self._check_open()
        d = self._pending(decision)
        chosen = _verdict(verdict, answer)
        if self._client is not None:
            self._client.decide(self.session_id, d.turn_id, d.call_id, chosen, answer)
            data = self._client.settle(self.session_id, d.turn_id, on_decision=on_decision)
            _wire.output_of(data)  # TurnFailed unless it completed
            done = _wire.turn_of(data)
        else:
            rt = self._rt()
            done = rt.call(self._decided(d.turn_id, d.call_id, chosen, answer, on_decision))
        return Response.of_turn(done, self.after_turn(done.input, done.output or ""))

    async def adecide(
        self,
        decision: Decision | str,
        verdict: Verdict | None = None,
        answer: str | None = None,
        *,
        on_decision: OnDecision | None = None,
    ) -> Response:
        """See :meth:`decide`."""
        self._check_open()
        chosen = _verdict(verdict, answer)
        if self.is_remote:
            async with self._async_client() as client:
                d = await self._apending(decision, client)
                await client.decide(self.session_id, d.turn_id, d.call_id, chosen, answer)
                data = await client.settle(self.session_id, d.turn_id, on_decision=on_decision)
            _wire.output_of(data)  # TurnFailed unless it completed
            done = _wire.turn_of(data)
        else:
            rt = self._rt()
            if isinstance(decision, str):
                pending = await rt.acall(rt.runtime.decisions(self.key, status="pending"))
                d = _named(decision, pending)
            else:
                d = decision
            done = await rt.acall(self._decided(d.turn_id, d.call_id, chosen, answer, on_decision))
        text = await self.aafter_turn(done.input, done.output or "")
        return Response.of_turn(done, text)

    def _pending(self, decision: Decision | str) -> Decision:
        if isinstance(decision, Decision):
            return decision
        return _named(decision, self.decisions("pending"))

    async def _apending(self, decision: Decision | str, client: AsyncClient) -> Decision:
        if isinstance(decision, Decision):
            return decision
        return _named(decision, await client.decisions(self.session_id, status="pending"))

    async def _decided(
        self,
        turn_id: str,
        call_id: str,
        verdict: Verdict,
        answer: str | None,
        on_decision: OnDecision | None,
    ) -> Turn:
        """On the runtime's loop: decide, then wait for the turn as ``Runtime.chat`` does."""
        runtime = self._rt().runtime
        # The turn goes on here, in this process, maybe not the one that sent it (it exited,
        # or it waits elsewhere): it needs this session's agents served, as chat serves them.
        for agent in self._agents.values():
            runtime.register(agent)
        turn = await runtime.sessions.turn(self.key, turn_id)
        wanted = turn.agent if turn is not None else None
        if wanted is not None and runtime.resolve(wanted.name, wanted.fingerprint) is None:
            # Decided here, it would go on here and fail (agent_not_found) for good: refused
            # before anything is recorded, the decision still open.
            raise ConfigError(
                f"this process does not serve the agent {wanted.name!r} the turn runs: make it "
                f"first (session.Agent({wanted.name!r}, …) as where the turn was sent), then "
                "decide"
            )
        # The session's user decides, and the turn goes on as that user (its tools'
        # ctx.principal), as its chat ran.
        await runtime.decide(
            self.key, turn_id, call_id, verdict, answer=answer, principal=self.principal
        )
        # The decision queued the turn again: this returns once it waits again or has ended.
        turn = await runtime.scheduler.wait(self.key, turn_id, until_input=True)
        done = await runtime.settle(turn, on_decision)
        if done.status != "completed":
            raise TurnFailed(done)
        return done

    @staticmethod
    def _check_alive(record: SessionRecord) -> None:
        if record.expired():
            raise SessionNotFound("the session has expired")

    chat_async = achat

    # -- state and history -----------------------------------------------------------------------
    def save_state(self, state: dict[str, Any] | None = None) -> None:
        """Replace the session's small JSON state (creating the session if need be); the keys
        tether keeps there (``always_approve``, ``session``) stay unless ``state`` names them.

        With no argument, save what the session is, as PraisonAI documents: its metadata, its
        memory and knowledge references and its agents' configurations, under ``session``
        next to what the state already holds (saving it again changes nothing)."""
        if state is not None and not isinstance(state, dict):
            raise ConfigError(f"save_state takes a dict, not {type(state).__name__}")
        rt = self._rt()
        record = self._ensure(self._named_agent() or NO_AGENT)
        if state is None:
            state = {**record.state, "session": self._bundle(record)}
        else:
            # tether's own keys stay unless the new state names them: the tools approved for
            # good ("always") are not revoked, nor the saved bundle lost, by saving a dict.
            kept = {k: record.state[k] for k in _OWN_STATE if k in record.state}
            state = {**kept, **state}
        rt.call(rt.runtime.sessions.update(self.key, state=dict(state)))

    def _bundle(self, record: SessionRecord) -> dict[str, Any]:
        agents = list(self._agents.values())
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "session_ttl": self.session_ttl,
            "metadata": dict(record.metadata),
            "memory": {"options": dict(self._memory), "user_id": self.user_id},
            "knowledge": {"collections": [self.collection] if self.collection else []},
            "agents": [
                {
                    "name": a.name,
                    "instructions": a.instructions,
                    "model": a.model if isinstance(a.model, str | None) else type(a.model).__name__,
                    "tools": [t.name for t in a.tools],
                    "handoffs": [h.agent_name for h in a.handoffs],
                    "memory": {
                        "scopes": list(a.memory.scopes),
                        "knowledge": list(a.memory.knowledge),
                    },
                }
                for a in agents
            ],
        }

    def restore_state(self) -> dict[str, Any]:
        record = self._record()
        return dict(record.state) if record and not record.expired() else {}

    def get_context(self, limit: int = 1000) -> dict[str, Any]:
        """What the session is: ``session_id``, ``user_id``, ``created_at``, ``updated_at``,
        ``message_count`` (its chat messages), ``agents`` (those that ran its turns, in order),
        ``expires_at``, ``state``, and ``messages``: the newest ``limit`` chat messages, oldest
        first (failed turns' items, tool calls and summaries left out). A session not stored
        yet has no times, no messages and no agents."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"get_context takes a positive limit, not {limit!r}")
        record = self._record()
        context: dict[str, Any] = {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "created_at": record.created_at if record else None,
            "updated_at": record.updated_at if record else None,
            "message_count": 0,
            "agents": [],
            "expires_at": record.expires_at if record else None,
            "state": {},
            "messages": [],
        }
        if record is None or record.expired():
            # Expired, its history and state are gone (the sweep deletes them soon after):
            # never read back, as over HTTP, where it is a 404.
            return context
        context["state"] = dict(record.state)
        rt = self._rt()
        messages: list[Item] = rt.call(self._newest_messages(limit))
        for i in reversed(messages):
            entry: dict[str, Any] = {"role": i.kind, "content": i.content}
            if i.kind == "assistant" and isinstance(i.meta.get("agent"), str):
                entry["agent"] = i.meta["agent"]  # several agents (or a handoff) may answer
            if not i.complete:
                entry["complete"] = False
            context["messages"].append(entry)
        context["message_count"], context["agents"] = rt.call(self._counted())
        return context

    async def _counted(self) -> tuple[int, list[str]]:
        """Chat messages that may reach a model, and the agents of the turns, in order."""
        sessions = self._rt().runtime.sessions
        count, after = 0, 0
        while True:
            page = await sessions.items(self.key, after=after, limit=CONTEXT_PAGE)
            count += sum(1 for i in page if i.kind in ("user", "assistant") and not i.excluded)
            if len(page) < CONTEXT_PAGE:
                break
            after = page[-1].seq
        agents: dict[str, None] = {}
        after = 0
        while True:
            turns = await sessions.turns(self.key, after=after, limit=CONTEXT_PAGE)
            for t in turns:  # the agent it was sent to, and the one a handoff passed it to
                agents.update(
                    (name, None) for name in (t.agent.name if t.agent else None, t.ran_by) if name
                )
            if len(turns) < CONTEXT_PAGE:
                break
            after = turns[-1].seq
        return count, list(agents)

    async def _newest_messages(self, limit: int) -> list[Item]:
        """Up to ``limit`` user and assistant items, newest first, paging backwards: the cost
        follows what is returned, not the length of the history."""
        sessions = self._rt().runtime.sessions
        found: list[Item] = []
        before: int | None = None
        while len(found) < limit:
            page = await sessions.recent(self.key, before=before, limit=CONTEXT_PAGE)
            found += [i for i in page if i.kind in ("user", "assistant")]
            if len(page) < CONTEXT_PAGE:
                break
            before = page[-1].seq
        return found[:limit]

    # -- memory and knowledge -------------------------------------------------------------------
    @property
    def principal(self) -> Principal:
        # Embedded use is the whole store's own: it may write agent and tenant memory too.
        return Principal("local", self.user_id, frozenset({"admin"}))

    def add_memory(self, content: str, *, scope: str = "user", kind: str = "fact") -> str:
        """Remember ``content`` (``user`` scope: every session of this user; or ``session``);
        returns the item's id."""
        self._check_open()
        if self._client is not None:
            body = {"content": content, "scope": scope, "kind": kind}
            if scope == "session":
                self._client.ensure_session(self.session_id, self.agent_name)
                body["session_id"] = self.session_id
            return str(self._client.request("POST", "/v1/memory", json=body)["id"])
        rt = self._rt()
        agent = self._named_agent()
        if scope == "session":
            self._ensure(agent or NO_AGENT)
        record = rt.call(
            self._started(
                rt.runtime.memory.add(
                    self.principal,
                    content,
                    scope=scope,
                    kind=kind,
                    session_id=self.session_id,
                    agent=agent,
                )
            )
        )
        return record.id

    def search_memory(self, query: str, *, limit: int = 5) -> list[dict[str, Any]]:
        """The best memory items for ``query`` from this session, this user and shared memory
        (agent memory too, once the session has an agent)."""
        self._check_open()
        if self._client is not None:
            body: dict[str, Any] = {"query": query, "limit": limit}
            if self._record_remote_exists():
                body["session_id"] = self.session_id
            hits = self._client.request("POST", "/v1/memory/search", json=body)["data"]
            return [{**h["item"], "score": h["score"]} for h in hits]
        rt = self._rt()
        record = self._record()
        # An expired session's memory is gone with it (the sweep deletes it soon after).
        session_id = self.session_id if record is not None and not record.expired() else None
        found: list[Hit] = rt.call(
            self._started(
                rt.runtime.memory.search_for(
                    self.principal,
                    query,
                    session_id=session_id,
                    agent=self._named_agent(),
                    limit=limit,
                )
            )
        )
        return [_hit_dict(h) for h in found]

    def add_knowledge(
        self, source: str | Path, *, collection: str | None = None, name: str | None = None
    ) -> dict[str, Any]:
        """Index a file (text, Markdown, HTML, PDF) or, if ``source`` is not a file, the text
        itself, into this user's ``collection`` (default: the session's); this session's agents
        retrieve from it."""
        self._check_open()
        collection = collection or self.collection or DEFAULT_COLLECTION
        path = _as_path(source)
        if path is not None:
            data, doc_name = path.read_bytes(), name or path.name
        else:
            # Named by its content: two texts are two documents (the same text twice, one).
            data = str(source).encode()
            doc_name = name or f"text-{hashlib.sha256(data).hexdigest()[:12]}"
        if self._client is not None:
            files = {"file": (doc_name, data)}
            out: dict[str, Any] = self._client.request(
                "POST", f"/v1/knowledge/{collection}/documents", files=files
            )
            return out
        rt = self._rt()
        doc = rt.call(
            self._started(
                rt.runtime.memory.add_document(self.principal, collection, data, name=doc_name)
            )
        )
        return {"id": doc.id, "name": doc.name, "chunks": doc.chunks, "collection": collection}

    def search_knowledge(
        self, query: str, *, collection: str | None = None, limit: int = 5
    ) -> list[dict[str, Any]]:
        self._check_open()
        collection = collection or self.collection or DEFAULT_COLLECTION
        if self._client is not None:
            body = {"query": query, "limit": limit}
            hits = self._client.request("POST", f"/v1/knowledge/{collection}/search", json=body)[
                "data"
            ]
            return list(hits)
        rt = self._rt()
        memory = rt.runtime.memory
        namespaces = memory.readable(
            self.principal, session_id=self.session_id, agent=self._named_agent()
        )
        found: list[Hit] = rt.call(
            self._started(memory.search_knowledge(namespaces, query, [collection], limit=limit))
        )
        return [_hit_dict(h) for h in found]

    async def _started(self, work: Awaitable[T]) -> T:
        # The store opens with the runtime's first use; memory calls may be that first use.
        await self._rt().runtime.start()
        return await work

    def _record_remote_exists(self) -> bool:
        assert self._client is not None
        try:
            self._client.request("GET", f"/v1/sessions/{self.session_id}")
        except TetherError:
            return False
        return True

    def is_expired(self) -> bool:
        remaining = self.time_to_expiry()
        return remaining is not None and remaining <= 0

    def time_to_expiry(self) -> float | None:
        """Seconds left before the session expires; None when it has no TTL."""
        record = self._record()
        expires = record.expires_at if record else None
        if expires is None:
            if self.session_ttl is None or record is not None:
                return None
            return self.session_ttl  # not created yet: the whole TTL is ahead
        return max(0.0, expires - time.time())  # an expired session has none left, not less

    def clear(self, *, workspace: bool = False) -> None:
        """Delete this session's history (the session itself stays); with ``workspace``, its
        workspace files too."""
        if self._record() is None:
            raise SessionNotFound("session not found")
        rt = self._rt()
        rt.call(rt.runtime.sessions.clear(self.key, workspace=workspace))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _finish_turns(self, wait: float) -> None:
        runtime = default_runtime().runtime
        await runtime.start()
        try:
            active = await runtime.sessions.active_turns(self.key)
        except SessionNotFound:
            return  # never stored: no turn ever ran
        for turn in active:
            try:
                async with asyncio.timeout(wait):
                    await runtime.scheduler.wait(turn.key, turn.id, until_input=True)
            except TimeoutError:
                await runtime.scheduler.cancel(turn.key, turn.id, "caller_cancelled")
        # Its MCP servers go with the object (the conversation stays; its next use starts
        # them again). A turn parked on a decision starts them again when it resumes.
        await runtime.mcp.close_session(self.key)

    def close(self, wait: float = CLOSE_WAIT) -> None:
        """Done with this object: a remote session's connection is closed, and every later
        call on it raises :class:`SessionClosed`. Closing again does nothing.

        A turn of the session still under way is waited for, up to ``wait`` seconds, then
        cancelled (one that waits for a human decision is left waiting: the decision may come
        from anywhere). The conversation itself stays stored (``Session(session_id=...)`` opens
        it again), and agents made with :meth:`Agent` are templates of their own that keep
        working."""
        if self._closed:
            return
        if self._used and self._client is None:
            rt = default_runtime()
            # Inside an event loop nothing may block it: aclose() waits there.
            with contextlib.suppress(SyncInAsyncContext):
                rt.call(self._finish_turns(wait))
        self._mark_closed()

    async def aclose(self, wait: float = CLOSE_WAIT) -> None:
        """:meth:`close` for async code: waits for the session's turns without blocking."""
        if self._closed:
            return
        if self._used and self._client is None:
            rt = default_runtime()
            await rt.acall(self._finish_turns(wait))
        self._mark_closed()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _mark_closed(self) -> None:
        self._closed = True
        self._agent = None
        self._agents.clear()
        if self._client is not None:
            client, self._client = self._client, None
            client.close()


Middleware = Callable[[str, str], "str | Awaitable[str]"]
"""``fn(message, response) -> response``, sync or async: run after every turn of every agent of
the session, in order, each given the reply the one before returned."""


class SessionAgent(AgentTemplate):
    """An agent made by :meth:`Session.Agent`: a template like any other (the same fingerprint,
    served the same way), whose ``chat`` replies pass through its session's middleware."""

    _session: Session

    def chat(self, message: str, **kw: Any) -> Response:
        self._session._check_open()  # a closed session's agents are closed with it
        reply = super().chat(message, **kw)
        return reply.passed_through(self._session.after_turn(message, reply))

    async def achat(self, message: str, **kw: Any) -> Response:
        self._session._check_open()
        reply = await super().achat(message, **kw)
        return reply.passed_through(await self._session.aafter_turn(message, reply))


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _async_client_class() -> type[AsyncClient]:
    # Imported when a remote session is made: embedded use never loads httpx.
    from tether.client import AsyncClient

    return AsyncClient


def _good_user_id(user_id: object) -> bool:
    # Any identity provider's subject is welcome ("auth0|42", an e-mail); what is not text, or
    # would not print in a log line, is a caller's mistake.
    return (
        isinstance(user_id, str)
        and 0 < len(user_id) <= 256
        and user_id.isprintable()
        and user_id.strip() == user_id
    )


def _verdict(verdict: Verdict | None, answer: str | None) -> Verdict:
    """As ``POST …/decisions`` reads it: an answer answers, else the default is approve."""
    if verdict is not None:
        return verdict
    return "answer" if answer is not None else "approve"


def _named(call_id: str, pending: list[Decision]) -> Decision:
    for d in pending:
        if d.call_id == call_id:
            return d
    raise DecisionNotFound(f"no pending decision on call {call_id!r} in this session")


_OWN_STATE = (ALWAYS_KEY, "session")
"""Keys of a session's state that tether writes: what the session approved for good, and
what ``save_state()`` saved of it."""

_DOCUMENT_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".html", ".htm", ".pdf")


def _as_path(source: str | Path) -> Path | None:
    """The file ``source`` names, or None when it is text to index as it is.

    Something that looks like a file name (a Path, one line ending in a document suffix, or a
    word with a path separator) must exist: a typo is an error, not a one-line document.
    """
    if isinstance(source, Path):
        path = source
    elif "\n" in source or len(source) > 1024:
        return None
    elif source.lower().endswith(_DOCUMENT_SUFFIXES) or (
        not any(c.isspace() for c in source) and ("/" in source or source.startswith("~"))
    ):
        path = Path(source).expanduser()
    else:
        return None
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    return path


def _hit_dict(hit: Hit) -> dict[str, Any]:
    r = hit.record
    return {
        "id": r.id,
        "scope": r.namespace.scope,
        "kind": r.kind,
        "content": r.content,
        "collection": r.collection or None,
        "meta": dict(r.meta),
        "score": hit.score,
    }
