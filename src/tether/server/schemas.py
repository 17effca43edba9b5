"""Pydantic models of the wire format (and nothing else: the core uses dataclasses)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, model_validator

from tether.records import Decision, Item, Policy, SessionRecord, SessionStatus, Turn, Verdict
from tether.store.rules import decision_data

SESSION_ID = r"^(?!\.+$)[A-Za-z0-9._:-]{1,128}$"
MAX_INT64 = 2**63 - 1
"""Revisions and cursors are stored as 64-bit integers: beyond this no stored one exists."""
NO_NUL = r"^[^\x00]*$"
"""Text the stores keep as text: PostgreSQL cannot hold a NUL, so no backend is given one."""
_MINTED_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A parameter's schema without FastAPI's ``null`` alternative (of an optional parameter):
    a query string, header or path holds text, and a fuzzer that sends ``null`` sends the text
    ``null`` (``If-Match: null``). An optional parameter is one that is not ``required``."""
    alternatives = schema.get("anyOf")
    if not alternatives or not any(a.get("type") == "null" for a in alternatives):
        return schema
    rest = [a for a in alternatives if a.get("type") != "null"]
    out = {k: v for k, v in schema.items() if k != "anyOf"}
    if "default" in out and out["default"] is None:
        del out["default"]
    return {**rest[0], **out} if len(rest) == 1 else {**out, "anyOf": rest}


def minted(value: str) -> bool:
    """Whether ``value`` could be an id tether minted (``t_…``, ``mem_…``, ``doc_…``): anything
    else is answered 404 without asking the store, which might refuse it otherwise (a NUL)."""
    return _MINTED_ID.fullmatch(value) is not None


# Session ids are documented with their pattern but checked by the route, so that a bad id
# answers 400 ``invalid-input`` wherever it appears (path, body), never a 422 in one place and
# a 400 in another.
_SESSION_ID_DOC: dict[str, Any] = {"pattern": SESSION_ID, "minLength": 1, "maxLength": 128}


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AgentOut(BaseModel):
    name: str
    description: str
    model: str
    tools: list[str]
    handoffs: list[str] = Field(
        default_factory=list, description="The agents it may pass a conversation to."
    )
    ask_user: bool = Field(False, description="Whether it may ask the user a question.")


class AgentList(BaseModel):
    data: list[AgentOut]


Seconds = Annotated[float, Strict()]
"""A number of seconds: a JSON number, never ``true`` or ``"30"`` (pydantic's lax mode takes
both for a float, where the documented schema says number)."""


class SessionCreate(Wire):
    agent: str | None = Field(None, description="Agent name; default: the only or first agent.")
    session_id: str | None = Field(
        None,
        description="1-128 of [A-Za-z0-9._:-]; omit for a new, unguessable id.",
        json_schema_extra=_SESSION_ID_DOC,
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    ttl_seconds: Seconds | None = Field(None, gt=0, le=10 * 365 * 86400)


class SessionPatch(Wire):
    metadata: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    ttl_seconds: Seconds | None = Field(None, gt=0, le=10 * 365 * 86400)
    expected_revision: int | None = Field(None, ge=0, le=MAX_INT64)


class SessionOut(BaseModel):
    session_id: str
    agent: str
    metadata: dict[str, Any]
    state: dict[str, Any]
    created_at: float
    updated_at: float
    expires_at: float | None
    revision: int
    status: SessionStatus | None = Field(
        None, description="idle, busy (a turn under way or queued), or awaiting_input"
    )
    item_count: int | None = None
    turn_count: int | None = None
    agents: list[str] | None = Field(
        None, description="The agents its turns were sent to or handed to, first seen first."
    )

    @classmethod
    def of(cls, r: SessionRecord, **extra: Any) -> SessionOut:
        return cls(
            session_id=r.key.session_id,
            agent=r.agent,
            metadata=r.metadata,
            state=r.state,
            created_at=r.created_at,
            updated_at=r.updated_at,
            expires_at=r.expires_at,
            revision=r.revision,
            **extra,
        )


class SessionPage(BaseModel):
    data: list[SessionOut]
    next_cursor: str | None


class ItemOut(BaseModel):
    seq: int
    turn_id: str
    kind: str
    content: str
    complete: bool
    call_id: str | None
    tool_name: str | None
    arguments: str | None
    excluded: bool
    created_at: float
    agent: str | None = Field(
        None,
        description="The agent that wrote the item (null for user messages). A `handoff` "
        "item's content is the agent the conversation passed to.",
    )

    @classmethod
    def of(cls, i: Item) -> ItemOut:
        agent = i.meta.get("agent")
        return cls(
            agent=agent if isinstance(agent, str) else None,
            seq=i.seq,
            turn_id=i.turn_id,
            kind=i.kind,
            content=i.content,
            complete=i.complete,
            call_id=i.call_id,
            tool_name=i.tool_name,
            arguments=i.arguments,
            excluded=i.excluded,
            created_at=i.created_at,
        )


class ItemPage(BaseModel):
    data: list[ItemOut]
    next_cursor: str | None


# NUL is documented here and refused by ``check_message`` (400 ``invalid-input``, as elsewhere).
_MESSAGE_DOC: dict[str, Any] = {"pattern": NO_NUL}


IDEMPOTENCY_KEY = r"^[\x21-\x7e]+$"
"""Visible ASCII, no spaces: what fits a header and a log line alike."""


class TurnCreate(Wire):
    input: str = Field(
        ...,
        min_length=1,
        description="The user's message (user role only; no NUL characters).",
        json_schema_extra=_MESSAGE_DOC,
    )
    agent: str | None = Field(
        None, min_length=1, description="The agent to answer; default: the session's own."
    )
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        pattern=IDEMPOTENCY_KEY,
        description="As the Idempotency-Key header: a retry gets the turn the first one made.",
    )
    policy: Policy = "enqueue"
    # Strict: "yes" is no flag (lax pydantic read {"stream": "yes"} as a stream, 0 as false).
    stream: StrictBool = Field(False, description="Answer with an SSE stream of the turn's events.")
    wait: StrictBool = Field(
        True, description="Wait for the turn to end (false: 202, queued turn)."
    )
    on_disconnect: Literal["continue", "cancel"] = "continue"


class UsageOut(BaseModel):
    input_tokens: int
    output_tokens: int
    model_calls: int


class TurnOut(BaseModel):
    id: str
    session_id: str
    seq: int
    input: str
    policy: str
    status: str
    reason: str | None
    error: str | None
    output: str | None
    complete: bool
    usage: UsageOut
    created_at: float
    started_at: float | None
    ended_at: float | None
    agent: str | None = Field(None, description="The agent the turn was submitted for.")
    ran_by: str | None = Field(
        None,
        description="The agent the turn ended with: `agent`, or the one a handoff passed the "
        "conversation to. Null until the turn ends.",
    )
    decisions: list[DecisionOut] = Field(
        default_factory=list,
        description="Pending decisions this turn waits for — its own when it is awaiting_input, "
        "or those of the turn named in behind — to decide with POST …/turns/{turn_id}/decisions "
        "(each names its turn). Empty otherwise: GET …/turns/{tid}/decisions lists them all.",
    )
    behind: str | None = Field(
        None,
        description="The turn awaiting input that this queued turn waits behind (202 answers).",
    )

    @classmethod
    def of(
        cls, t: Turn, decisions: list[Decision] | None = None, *, behind: str | None = None
    ) -> TurnOut:
        return cls(
            decisions=[DecisionOut.of(d) for d in decisions or []],
            behind=behind,
            id=t.id,
            session_id=t.key.session_id,
            seq=t.seq,
            input=t.input,
            policy=t.policy,
            status=t.status,
            reason=t.reason,
            error=t.error,
            output=t.output,
            complete=t.complete,
            usage=UsageOut(
                input_tokens=t.usage.input_tokens,
                output_tokens=t.usage.output_tokens,
                model_calls=t.usage.model_calls,
            ),
            created_at=t.created_at,
            started_at=t.started_at,
            ended_at=t.ended_at,
            agent=t.agent.name if t.agent is not None else None,
            ran_by=t.ran_by,
        )


class TurnPage(BaseModel):
    data: list[TurnOut]
    next_cursor: str | None


class DecisionIn(Wire):
    """A human's decision on what a parked turn asks (``decision.requested``)."""

    # The schema says what the validator below checks: one of them says what was decided.
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "anyOf": [
                {"required": ["decision"], "properties": {"decision": {"type": "string"}}},
                {"required": ["answer"], "properties": {"answer": {"type": "string"}}},
                {"required": ["approve"], "properties": {"approve": {"type": "boolean"}}},
            ],
            # What contradicts itself (see the validator).
            "not": {
                "anyOf": [
                    {"required": ["decision", "approve"]},
                    {"required": ["answer", "approve"]},
                    {
                        "required": ["answer", "decision"],
                        "properties": {"decision": {"enum": ["approve", "deny", "always"]}},
                    },
                ]
            },
        },
    )

    call_id: str = Field(..., min_length=1, max_length=128)
    decision: Literal["approve", "deny", "always", "answer"] | None = Field(
        None,
        description="approve, deny or always (this tool, for the rest of the session) for an "
        "approval; answer (with answer) or deny for a question. Default: answer when answer is "
        "given.",
    )
    answer: str | None = Field(None, max_length=10_000, description="A question's answer.")
    approve: StrictBool | None = Field(
        None, description="Older form of decision: true = approve, false = deny."
    )

    @model_validator(mode="after")
    def _says_something(self) -> DecisionIn:
        if self.decision is None and self.answer is None and self.approve is None:
            raise ValueError("say what you decide: decision (approve, deny, always, answer)")
        # Which one would count is a guess: a request that contradicts itself is refused (an
        # answer sent with approve was taken as approve, the answer dropped).
        if self.decision is not None and self.approve is not None:
            raise ValueError("send decision or approve (its older form), not both")
        if self.answer is not None and (self.approve is not None or self.verdict() != "answer"):
            raise ValueError(
                "an answer goes with decision 'answer' (or alone), not with approve, deny or always"
            )
        return self

    def verdict(self) -> Verdict:
        if self.decision is not None:
            return self.decision
        if self.answer is not None:
            return "answer"
        return "approve" if self.approve else "deny"


class DecisionOut(BaseModel):
    turn_id: str
    call_id: str
    kind: str = Field(..., description="approval or question")
    payload: dict[str, Any] = Field(
        ...,
        description="tool and arguments (approval); question and choices (question); steps "
        "(going on past the iteration limit).",
    )
    status: str = Field(..., description="pending, approved, denied, always, answered, expired")
    answer: str | None
    decided_by: str | None
    created_at: float
    deadline: float
    decided_at: float | None

    @classmethod
    def of(cls, d: Decision) -> DecisionOut:
        return cls(**decision_data(d))


class DecisionList(BaseModel):
    decisions: list[DecisionOut]


class ChatRequest(Wire):
    """PraisonAI AgentOS's ``/api/chat`` request."""

    model_config = ConfigDict(extra="ignore")
    message: str = Field(
        ...,
        min_length=1,
        description="The user's message (user role only; no NUL characters).",
        json_schema_extra=_MESSAGE_DOC,
    )
    session_id: str | None = Field(
        None,
        description="Continue (or start) this session of yours; omit (or empty) for a fresh one.",
        json_schema_extra={"pattern": "^[A-Za-z0-9._:-]{0,128}$", "maxLength": 128},
    )
    agent_name: str | None = Field(None, description="Default: the server's first agent.")


class ChatResponse(BaseModel):
    response: str
    agent_name: str
    session_id: str
    turn_id: str | None = Field(None, description="The turn that answered (tether's addition).")
    complete: Literal[False] | None = Field(
        default=None,
        description="false when the reply was cut short at the output limit (tether's addition, "
        "there only then: partial text is never passed off as a whole reply).",
    )


class AgentRequest(Wire):
    """The remote-agent contract's request (``POST /agent``)."""

    model_config = ConfigDict(extra="ignore")
    message: str = Field(
        ...,
        min_length=1,
        description="The user's message (user role only; no NUL characters).",
        json_schema_extra=_MESSAGE_DOC,
    )
    session_id: str | None = Field(
        None,
        description="Continue (or start) this session of yours; omit (or empty) for a fresh one.",
        json_schema_extra={"pattern": "^[A-Za-z0-9._:-]{0,128}$", "maxLength": 128},
    )


class AgentMetadata(BaseModel):
    agent_name: str = Field(..., description="The agent that answered (or asks).")
    timestamp: float = Field(..., description="When the turn ended (seconds since the epoch).")
    turn_id: str
    status: str = Field(
        ...,
        description="completed; or (202) awaiting_input, or queued behind a turn that asks",
    )
    decisions: list[DecisionOut] = Field(
        default_factory=list,
        description="(202) What the turn waits for: decide each with POST "
        "/v1/sessions/{session_id}/turns/{decision.turn_id}/decisions, then follow the turn.",
    )
    behind: str | None = Field(None, description="(202) The turn awaiting input it waits behind.")
    complete: Literal[False] | None = Field(
        default=None,
        description="false when the reply was cut short at the output limit (there only then).",
    )


class AgentReply(BaseModel):
    """The remote-agent contract's answer: ``{content, session_id, metadata}``."""

    content: str
    session_id: str
    metadata: AgentMetadata


class ProblemOut(BaseModel):
    """RFC 9457 problem details; some types add members (``errors``, ``busy_turn_id``, ``turn``,
    ``agents``)."""

    model_config = ConfigDict(extra="allow", title="Problem")
    type: str = Field(..., description="A stable URI naming the kind of problem.")
    title: str
    status: int
    detail: str


class Health(BaseModel):
    status: Literal["ok"]
    node: str | None = Field(
        None,
        description="The node name of the process that answered, when it has one (`--node`; "
        "each of `--workers` has its own).",
    )
