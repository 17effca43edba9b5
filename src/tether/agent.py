"""The agent template: frozen, with no I/O and no per-conversation state.

One ``Agent`` serves any number of sessions and threads at once; a conversation's history,
state and turn order live in the store, keyed by session, never on this object. The
conversational methods (``chat``, ``achat``…) hand the turn to a process-wide runtime
(:mod:`tether.embedded`); they do not mutate the agent.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import warnings
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tether.errors import ConfigError
from tether.handoff import Handoff, handoffs_of
from tether.models.base import Model
from tether.records import AgentRef, Decision, Policy, validate_session_id
from tether.reply import Response
from tether.skills import Skill, coerce_skills
from tether.tools.mcp.specs import McpHttp, McpServer, McpStdio
from tether.tools.tool import Tool

if TYPE_CHECKING:
    from tether.records import Event


_MEMORY_OPTIONS = frozenset(
    {
        "session_id",
        "user_id",
        "session_ttl",
        "scopes",
        "auto",
        "remember",
        "recall_limit",
        "knowledge",
        "knowledge_tool",
        "summarize",
        "notes",
        "history",
        "auto_save",
    }
)
_SCOPES = ("session", "user", "agent", "tenant")
_DEFAULT_SCOPES = ("session", "user", "agent", "tenant")


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """Where an agent's conversations live and what it remembers (DESIGN §8)."""

    session_id: str | None = None
    """Persist this conversation under this id; a new process with the same id resumes it."""
    user_id: str | None = None
    """Owner of the session in embedded use (default ``local``)."""
    session_ttl: float | None = None
    """Seconds the session lives after it is created; then turns on it are refused."""
    scopes: tuple[str, ...] = _DEFAULT_SCOPES
    """Memory scopes recalled before each turn (all four by default: what the caller wrote to
    their user memory, or an admin to the agent's, is recalled); an empty list for no recall."""
    auto: bool | None = None
    """Keep the user's statements about themselves as notes, so even a small model can answer
    from recall. None (the default): on only for the embedded ``local`` model, which needs the
    crutch; a server may switch notes off for every agent (``TETHER_AUTO_NOTES=off``)."""
    notes: str = "session"
    """Where automatic notes go: ``session`` (default), or ``user`` to carry them across the
    user's sessions — chosen when ``scopes`` is given explicitly and names ``user``."""
    remember: bool = False
    """Give the model a ``remember`` tool (session or user memory only)."""
    recall_limit: int = 5
    knowledge: tuple[str, ...] = ()
    """Knowledge collections this agent retrieves from (searched in every scope the caller
    may read)."""
    knowledge_tool: bool = False
    """Offer the collections as a ``search_knowledge`` tool instead of putting the best chunks
    in the prompt before each turn."""
    summarize: bool = True
    """Summarise history that falls out of the prompt's window into a stored summary item."""
    history: bool = True
    """Send the conversation's earlier messages to the model (PraisonAI's ``history``); False:
    each turn sees only its own message (the history is still stored)."""

    @property
    def note_scope(self) -> str:
        return self.notes

    @classmethod
    def coerce(cls, value: MemoryPolicy | Mapping[str, Any] | bool | None) -> MemoryPolicy:
        if value is None or value is True:
            return cls()
        if value is False:
            return cls(scopes=(), auto=False)
        if isinstance(value, MemoryPolicy):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"memory is True, False, a MemoryPolicy or a mapping of its options, "
                f"not {type(value).__name__}"
            )
        unknown = set(value) - _MEMORY_OPTIONS
        if unknown:
            raise ConfigError(f"unknown memory options: {', '.join(sorted(unknown))}")
        sid = value.get("session_id")
        saved = value.get("auto_save")  # PraisonAI's name for the same thing
        if saved is not None and sid is not None and saved != sid:
            raise ConfigError("memory auto_save and session_id name two sessions; give one")
        sid = sid if sid is not None else saved
        if sid is not None:
            validate_session_id(sid)
        ttl = value.get("session_ttl")
        if ttl is not None and (not isinstance(ttl, int | float) or ttl <= 0):
            raise ConfigError("memory session_ttl must be a positive number of seconds")
        scopes = value.get("scopes", _DEFAULT_SCOPES)
        if isinstance(scopes, str) or not all(s in _SCOPES for s in scopes):
            raise ConfigError(f"memory scopes must be a list of {', '.join(_SCOPES)}")
        # Naming the user scope on purpose means "remember this user across sessions": the
        # automatic notes follow. By default they stay in the session they were said in.
        notes = value.get("notes", "user" if "scopes" in value and "user" in scopes else "session")
        if notes not in ("session", "user"):
            raise ConfigError("memory notes must be 'session' or 'user'")
        knowledge = value.get("knowledge", ())
        if isinstance(knowledge, str):
            knowledge = (knowledge,)
        limit = value.get("recall_limit", 5)
        if not isinstance(limit, int) or not 0 <= limit <= 50:
            raise ConfigError("memory recall_limit must be an integer from 0 to 50")
        return cls(
            session_id=sid,
            user_id=value.get("user_id"),
            session_ttl=ttl,
            scopes=tuple(dict.fromkeys(scopes)),
            notes=notes,
            auto=None if value.get("auto") is None else bool(value["auto"]),
            remember=bool(value.get("remember", False)),
            recall_limit=limit,
            knowledge=tuple(str(k) for k in knowledge),
            knowledge_tool=bool(value.get("knowledge_tool", False)),
            summarize=bool(value.get("summarize", True)),
            history=bool(value.get("history", True)),
        )


def MemoryConfig(
    *,
    auto_save: str | None = None,
    history: bool = True,
    user_id: str | None = None,
    **options: Any,
) -> MemoryPolicy:
    """PraisonAI's memory options, as tether's :class:`MemoryPolicy`: ``auto_save`` keeps the
    conversation under that session id (a new process resumes it), ``history`` sends earlier
    messages to the model (the default), ``user_id`` owns it; any other option of
    :class:`MemoryPolicy` (``scopes``, ``remember``, ``knowledge``…) too."""
    values = dict(options)
    if auto_save is not None:
        values["auto_save"] = auto_save
    if user_id is not None:
        values["user_id"] = user_id
    values["history"] = history
    return MemoryPolicy.coerce(values)


def _with_auto_save(policy: MemoryPolicy, auto_save: str | None) -> MemoryPolicy:
    """``Agent(auto_save=…)``, the older spelling of ``memory=MemoryConfig(auto_save=…)``."""
    if auto_save is None:
        return policy
    warnings.warn(
        "Agent(auto_save=...) is deprecated: use Agent(memory=MemoryConfig(auto_save=...))",
        DeprecationWarning,
        stacklevel=3,
    )
    if policy.session_id is not None and policy.session_id != auto_save:
        raise ConfigError("auto_save and memory session_id name two sessions; give one")
    return replace(policy, session_id=validate_session_id(auto_save))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of transient model errors (timeouts, 429, 5xx, dropped connections)."""

    attempts: int = 4
    initial_backoff: float = 0.5
    max_backoff: float = 8.0


def _is_model(value: object) -> bool:
    """Whether ``value`` has what the turn loop asks of a model (:class:`Model`)."""
    return all(hasattr(value, attr) for attr in ("name", "context_window", "stream"))


def _model_spec(model: str | Model | None) -> str:
    if model is None:
        return "default"
    if isinstance(model, str):
        return "spec:" + model
    cls = type(model)
    return f"object:{cls.__module__}.{cls.__qualname__}:{model.name}"


def _callable_name(fn: object) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{module}.{getattr(fn, '__qualname__', type(fn).__qualname__)}"


def _same_code(a: object, b: object) -> bool:
    if a is b:
        return True
    code_a, code_b = getattr(a, "__code__", None), getattr(b, "__code__", None)
    if code_a is None or code_b is None:
        return False
    # Equal code objects compare bytecode, constants, names and location: the same source.
    return bool(code_a == code_b) and getattr(a, "__defaults__", None) == getattr(
        b, "__defaults__", None
    )


def _mcp_servers(agent: str, given: Iterable[McpServer]) -> tuple[McpServer, ...]:
    servers = tuple(given)
    for server in servers:
        if not isinstance(server, McpStdio | McpHttp):
            raise ConfigError(f"{server!r} is not an MCP server; use McpStdio or McpHttp")
    if len({s.name for s in servers}) != len(servers):
        raise ConfigError(f"agent {agent}: two MCP servers share a name")
    return servers


def _fingerprint(agent: Agent) -> str:
    memory = asdict(agent.memory)
    for conversation_field in ("session_id", "user_id", "session_ttl"):
        memory.pop(conversation_field)
    definition = {
        "name": agent.name,
        "instructions": agent.instructions,
        "model": _model_spec(agent.model),
        "tools": [
            {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "function": _callable_name(t.function),
                "requires_approval": t.requires_approval,
                "read_only": t.read_only,
                "timeout": t.timeout,
            }
            for t in agent.tools
        ],
        "limits": [
            agent.max_iterations,
            agent.on_max_iterations,
            agent.token_budget,
            agent.context_budget,
            agent.max_output_tokens,
            agent.temperature,
            agent.tool_timeout,
            agent.approval_timeout,
            agent.max_total_iterations,
            agent.ask_user,
        ],
        "retry": asdict(agent.retry),
        "memory": memory,
        "description": agent.description,
        # The transfer tools are part of what the model is offered; a target given as an agent
        # is part of what this one does, so its own definition counts too.
        "handoffs": [
            [h.tool_name, h.description, h.agent_name, h.agent.fingerprint if h.agent else None]
            for h in agent.handoffs
        ],
    }
    if agent.skills:  # only when set: agents without skills keep the fingerprints they had
        # What the skills say is part of what the agent does; where their folders are is not
        # (the same skills checked out elsewhere are the same definition).
        definition["skills"] = [[s.name, s.description, s.instructions] for s in agent.skills]
    if agent.mcp:  # only when set: agents without MCP servers keep the fingerprints they had
        definition["mcp"] = [s.describe() for s in agent.mcp]
    canonical = json.dumps(definition, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True, eq=False)
class Agent:
    """An immutable agent template."""

    name: str
    instructions: str = "You are a helpful assistant."
    model: str | Model | None = None
    """A spec (``local``, ``openai:gpt-4o-mini``, ``ollama:llama3.2``), a Model, or None for the
    default (``TETHER_MODEL``, else ``local``)."""
    tools: tuple[Tool, ...] = ()
    max_iterations: int = 10
    """Model calls per turn before it ends ``limit_reached``/``max_iterations``."""
    on_max_iterations: Literal["stop", "ask", "finish"] = "stop"
    """At ``max_iterations``: ``stop`` ends the turn ``limit_reached``; ``ask`` puts a Decision
    to a human (go on for up to ``max_iterations`` more steps?), bounded by
    ``max_total_iterations``; ``finish`` makes one more model call without tools, told to answer
    with what it has, and the turn ends ``completed`` with reason ``finished_at_limit``."""
    max_total_iterations: int | None = None
    """With ``ask``: the steps a turn may never go past, however often a human says go on
    (None: four times ``max_iterations``); then ``limit_reached``/``max_total_iterations``."""
    ask_user: bool = False
    """Offer the built-in ``ask_user(question, choices?)`` tool: the turn waits for the answer."""
    token_budget: int | None = None
    """Tokens (input + output, all model calls) one turn may spend; then ``limit_reached``."""
    context_budget: int | None = None
    """Prompt tokens of history to send; default: what the model's context window leaves."""
    max_output_tokens: int | None = None
    temperature: float | None = None
    retry: RetryPolicy = RetryPolicy()
    tool_timeout: float = 120.0
    """Default seconds a tool call may take when the tool sets no timeout of its own."""
    approval_timeout: float = 600.0
    """Seconds a human decision (approval, question, going on past the limit) may take; then it
    expires and the model is told it was refused."""
    memory: MemoryPolicy = field(default_factory=MemoryPolicy)
    description: str = ""
    """What the agent is for: the description of the transfer tool of agents that hand off to
    it, and of the agent in listings."""
    handoffs: tuple[Handoff, ...] = ()
    """Agents this one may pass the conversation to (a ``transfer_to_<name>`` tool each); see
    :mod:`tether.handoff`."""
    skills: tuple[Skill, ...] = ()
    """Skills the model may activate (``activate_skill``); see :mod:`tether.skills`."""
    mcp: tuple[McpServer, ...] = ()
    """MCP servers whose tools the agent offers (``<server>__<tool>``), each session with its
    own connections (see :mod:`tether.tools.mcp`)."""
    # A private session for an agent used without a session_id: each Agent object has its own
    # conversation. It is an identity, not conversation state.
    _default_session_id: str = field(
        default_factory=lambda: "agent_" + secrets.token_urlsafe(16), repr=False
    )
    _fingerprint: str = field(default="", repr=False)

    def __init__(
        self,
        *,
        name: str,
        instructions: str = "You are a helpful assistant.",
        model: str | Model | None = None,
        tools: Iterable[Tool] = (),
        max_iterations: int = 10,
        on_max_iterations: Literal["stop", "ask", "finish"] = "stop",
        max_total_iterations: int | None = None,
        ask_user: bool = False,
        token_budget: int | None = None,
        context_budget: int | None = None,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        retry: RetryPolicy | None = None,
        tool_timeout: float = 120.0,
        approval_timeout: float = 600.0,
        memory: MemoryPolicy | Mapping[str, Any] | bool | None = None,
        description: str = "",
        handoffs: Iterable[Agent | Handoff | str] | None = None,
        skills: Iterable[Skill | str | Path] | str | Path = (),
        auto_save: str | None = None,
        mcp: Iterable[McpServer] = (),
    ) -> None:
        if not name or not isinstance(name, str):
            raise ConfigError("an agent needs a non-empty name")
        if model is not None and not isinstance(model, str) and not _is_model(model):
            raise ConfigError(
                f"agent {name}: model is a spec ('openai:gpt-4o-mini', 'local') or a model "
                f"object (name, context_window, stream), not {type(model).__name__}"
            )
        tools = tuple(tools)
        for t in tools:
            if not isinstance(t, Tool):
                raise ConfigError(f"{t!r} is not a tool; decorate the function with @tool")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ConfigError(f"agent {name}: two tools share a name")
        if max_iterations < 1:
            raise ConfigError("max_iterations must be at least 1")
        if on_max_iterations not in ("stop", "ask", "finish"):
            raise ConfigError("on_max_iterations must be 'stop', 'ask' or 'finish'")
        if max_total_iterations is not None and max_total_iterations < max_iterations:
            raise ConfigError("max_total_iterations must be at least max_iterations")
        if approval_timeout <= 0:
            raise ConfigError("approval_timeout must be a positive number of seconds")
        if ask_user and any(t.name == "ask_user" for t in tools):
            raise ConfigError(f"agent {name}: ask_user=True and a tool named ask_user")
        offered = coerce_skills(skills)
        if offered and "activate_skill" in names:
            raise ConfigError(f"agent {name}: skills and a tool named activate_skill")
        transfers = handoffs_of(handoffs, name)
        clash = sorted({h.tool_name for h in transfers} & set(names))
        if clash:
            raise ConfigError(f"agent {name}: a tool and a handoff are both named {clash[0]}")
        servers = _mcp_servers(name, mcp)
        values = {
            "name": name,
            "instructions": instructions,
            "model": model,
            "tools": tools,
            "max_iterations": max_iterations,
            "on_max_iterations": on_max_iterations,
            "max_total_iterations": max_total_iterations,
            "ask_user": bool(ask_user),
            "token_budget": token_budget,
            "context_budget": context_budget,
            "max_output_tokens": max_output_tokens,
            "temperature": temperature,
            "retry": retry or RetryPolicy(),
            "tool_timeout": tool_timeout,
            "approval_timeout": approval_timeout,
            "memory": _with_auto_save(MemoryPolicy.coerce(memory), auto_save),
            "description": description,
            "handoffs": transfers,
            "skills": offered,
            "mcp": servers,
            "_default_session_id": "agent_" + secrets.token_urlsafe(16),
        }
        for key, value in values.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_fingerprint", _fingerprint(self))

    @property
    def fingerprint(self) -> str:
        """A digest of what this template does: the same in every process that defines it alike.

        It covers the instructions, model, tools (name, description, parameters, approval,
        timeout), limits, memory policy and skills (name, description, instructions) — not
        where a conversation lives (session and user ids, TTL), which is the caller's, not the
        template's; nor where the skills' folders are.
        """
        return self._fingerprint

    @property
    def total_iterations(self) -> int:
        """Steps a turn may never go past (``max_total_iterations``, or its default)."""
        return self.max_total_iterations or 4 * self.max_iterations

    @property
    def ref(self) -> AgentRef:
        """What a turn records of the agent it was submitted for."""
        return AgentRef(self.name, self.fingerprint)

    def same_definition(self, other: Agent) -> bool:
        """True when ``other`` is this template: same fingerprint, the very same model object
        (two of one class may behave differently in one process: another script, another
        endpoint), and tools whose functions have the same code (a notebook cell run again
        defines new function objects of the same tools)."""
        if other is self:
            return True
        if other.fingerprint != self.fingerprint:
            return False
        if not isinstance(self.model, str | None) and other.model is not self.model:
            return False
        return all(
            _same_code(a.function, b.function) for a, b in zip(self.tools, other.tools, strict=True)
        )

    def tool_named(self, name: str) -> Tool | None:
        for t in self.tools:
            if t.name == name:
                return t
        return None

    def skill_named(self, name: str) -> Skill | None:
        for s in self.skills:
            if s.name == name:
                return s
        return None

    def handoff_named(self, tool_name: str) -> Handoff | None:
        """The handoff whose transfer tool is ``tool_name``, if any."""
        for h in self.handoffs:
            if h.tool_name == tool_name:
                return h
        return None

    def handoff_agents(self) -> list[Agent]:
        """The targets given as agents, and theirs, in order: what serving this agent serves."""
        found: dict[str, Agent] = {}
        todo: list[Agent] = [self]
        while todo:
            for h in todo.pop().handoffs:
                if isinstance(h.agent, Agent) and h.agent.name not in found:
                    found[h.agent.name] = h.agent
                    todo.append(h.agent)
        found.pop(self.name, None)
        return list(found.values())

    @property
    def session_id(self) -> str:
        """The session this object's ``chat``/``start`` calls continue."""
        return self.memory.session_id or self._default_session_id

    # -- conversation (delegates to the runtime; the template itself does no I/O) -----------
    def chat(
        self,
        message: str,
        *,
        session_id: str | None = None,
        policy: Policy = "enqueue",
        on_decision: Callable[[Decision], Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        """Run one turn and return the complete reply (blocking). See :meth:`achat`."""
        from tether.embedded import default_runtime

        return default_runtime().chat_sync(
            self,
            message,
            session_id=session_id,
            policy=policy,
            on_decision=on_decision,
            idempotency_key=idempotency_key,
        )

    def start(self, message: str, *, session_id: str | None = None) -> Response:
        """Same as :meth:`chat` (PraisonAI's name for the first call)."""
        return self.chat(message, session_id=session_id)

    async def achat(
        self,
        message: str,
        *,
        session_id: str | None = None,
        policy: Policy = "enqueue",
        on_decision: Callable[[Decision], Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Response:
        """Run one turn and return the complete reply: a ``str`` whose ``metadata`` names the
        agent that answered (after any handoff), the turn and its status.

        Raises :class:`tether.errors.TurnFailed` when the turn ends in any status other than
        ``completed``; the turn record (status, reason, partial output) is on the exception.
        What the turn asks a human (approval, ``ask_user``, going on past the iteration limit)
        goes to ``on_decision(decision)`` (sync or async), which returns True/"approve",
        False/"deny", "always", or a question's answer; without one,
        :class:`tether.errors.DecisionRequired` carries the decision (see ``Session.decide``).
        A retry with the same ``idempotency_key`` on the same session gets the turn the first
        call made (waited for, or its reply), never a second one.
        """
        from tether.embedded import default_runtime

        return await default_runtime().chat(
            self,
            message,
            session_id=session_id,
            policy=policy,
            on_decision=on_decision,
            idempotency_key=idempotency_key,
        )

    def astream(
        self, message: str, *, session_id: str | None = None, policy: Policy = "enqueue"
    ) -> AsyncIterator[Event]:
        """Run one turn and yield its events (``message.delta`` …) until ``turn.ended``."""
        from tether.embedded import default_runtime

        return default_runtime().stream(self, message, session_id=session_id, policy=policy)


def resolve_target(
    target: Handoff, served: Callable[[str, str | None], Agent | None]
) -> Agent | None:
    """The served agent a handoff names: the target's own definition when it was given as an
    agent, else the agent served under its name."""
    fingerprint = target.agent.fingerprint if target.agent is not None else None
    return served(target.agent_name, fingerprint)


def reachable(agent: Agent, served: Callable[[str, str | None], Agent | None]) -> dict[str, Agent]:
    """The agents ``agent`` can pass a conversation to, directly or through the agents it
    hands to, as ``served`` resolves them (a target that is not served is left out)."""
    found: dict[str, Agent] = {}
    todo = [agent]
    while todo:
        for h in todo.pop().handoffs:
            if h.agent_name in found or h.agent_name == agent.name:
                continue
            target = resolve_target(h, served)
            if target is not None:
                found[h.agent_name] = target
                todo.append(target)
    return found
