"""Who calls and what they own: principals, session keys, session rows, API keys."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from tether.records.ids import validate_session_id


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

    def expired(self, now: float | None = None) -> bool:
        """Past its TTL: the session answers as unknown, and takes no more turns."""
        return self.expires_at is not None and self.expires_at <= (
            time.time() if now is None else now
        )


@dataclass(frozen=True, slots=True)
class SessionStats:
    items: int
    turns: int
    active_turns: int
    """Queued, running and parked turns."""
    awaiting_input: int = 0
    """Turns parked on a human decision."""
    agents: tuple[str, ...] = ()
    """The agents its turns were sent to or handed to, in the order they first appear."""

    @property
    def status(self) -> SessionStatus:
        """``awaiting_input`` when a turn waits for a human, ``busy`` when one is under way or
        queued, else ``idle``."""
        if self.awaiting_input:
            return "awaiting_input"
        return "busy" if self.active_turns else "idle"


SessionStatus = Literal["idle", "busy", "awaiting_input"]
SessionOrder = Literal["id", "newest"]
"""How a listing of sessions is ordered: by id, or the most recently active first."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key as stored: only the hash of its secret is kept."""

    id: str
    tenant: str
    user: str
    roles: frozenset[str]
    hash: str
    created_at: float
    revoked_at: float | None
