"""The records the store holds: sessions, items, turns and events (plain frozen dataclasses)."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal

from tether.errors import InvalidSessionId

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")

TurnStatus = Literal[
    "queued",
    "running",
    "completed",
    "cancelled",
    "interrupted",
    "rolled_back",
    "limit_reached",
    "failed",
    "rejected",
]
TERMINAL_STATUSES: frozenset[str] = frozenset(
    {"completed", "cancelled", "interrupted", "rolled_back", "limit_reached", "failed", "rejected"}
)
ACTIVE_STATUSES: frozenset[str] = frozenset({"queued", "running"})
# Items of turns that ended like this never reach a model again (DESIGN §3).
EXCLUDED_STATUSES: frozenset[str] = frozenset({"failed", "rolled_back"})

Policy = Literal["enqueue", "reject", "interrupt", "rollback"]
POLICIES: tuple[Policy, ...] = ("enqueue", "reject", "interrupt", "rollback")

ItemKind = Literal["user", "assistant", "tool_call", "tool_result", "summary"]


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged, or raise: ids are never silently rewritten."""
    if not isinstance(session_id, str) or SESSION_ID_PATTERN.fullmatch(session_id) is None:
        raise InvalidSessionId("session_id must be 1-128 characters of letters, digits and '._:-'")
    return session_id


def new_session_id() -> str:
    """An unguessable id (128 random bits) in the session id alphabet."""
    return "s_" + secrets.token_urlsafe(16)


def new_turn_id() -> str:
    return "t_" + secrets.token_urlsafe(12)


def new_call_id() -> str:
    return "call_" + secrets.token_urlsafe(9)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling. Resolved outside the prompt, before anything else."""

    tenant: str
    user: str
    roles: frozenset[str] = frozenset()

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles


LOCAL_PRINCIPAL = Principal(tenant="local", user="local", roles=frozenset({"admin"}))


@dataclass(frozen=True, slots=True)
class SessionKey:
    """A session's identity: a ``session_id`` means something only inside its owner's namespace."""

    tenant: str
    owner: str
    session_id: str

    @classmethod
    def of(cls, principal: Principal, session_id: str) -> SessionKey:
        return cls(principal.tenant, principal.user, validate_session_id(session_id))


@dataclass(frozen=True, slots=True)
class SessionRecord:
    key: SessionKey
    agent: str
    metadata: dict[str, Any]
    state: dict[str, Any]
    created_at: float
    updated_at: float
    expires_at: float | None
    revision: int


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item as the turn loop produces it; the store assigns ``seq`` when it commits."""

    kind: ItemKind
    content: str = ""
    complete: bool = True
    """False for a partial assistant reply of a cancelled or interrupted turn."""
    call_id: str | None = None
    tool_name: str | None = None
    arguments: str | None = None
    """JSON text, tool calls only."""
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Item:
    seq: int
    turn_id: str
    kind: ItemKind
    content: str
    complete: bool
    call_id: str | None
    tool_name: str | None
    arguments: str | None
    meta: dict[str, Any]
    created_at: float
    excluded: bool = False
    """True when the item's turn ended failed; such items are kept for audit only."""


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0


@dataclass(frozen=True, slots=True)
class Turn:
    id: str
    key: SessionKey
    seq: int
    input: str
    policy: Policy
    status: TurnStatus
    reason: str | None
    error: str | None
    output: str | None
    complete: bool
    usage: Usage
    created_at: float
    started_at: float | None
    ended_at: float | None

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a turn; ``seq`` is per turn, so ``(turn_id, seq)`` names it for replay."""

    turn_id: str
    seq: int
    type: str
    data: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class TurnEnding:
    """How a turn ended, written with its last items in one fenced transaction."""

    status: TurnStatus
    reason: str
    output: str | None = None
    complete: bool = False
    error: str | None = None
    usage: Usage = Usage()


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of a session: writes are valid only while ``token`` is the current one."""

    key: SessionKey
    owner: str
    token: int
    expires_at: float
