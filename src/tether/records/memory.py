"""What memory holds: scoped records (facts, notes… and knowledge chunks) and documents.

A record lives in exactly one :class:`Namespace`: a scope plus the ids that scope is keyed by.
Namespaces are built from the caller's principal (never from request text), so a query can only
ever name namespaces the caller may read; see :meth:`Namespace.readable_by`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tether.errors import InvalidInput
from tether.records.sessions import Principal, SessionKey

Scope = Literal["session", "user", "agent", "tenant"]
SCOPES: tuple[Scope, ...] = ("session", "user", "agent", "tenant")
PersonalScope = Literal["session", "user"]
"""The scopes a user's own data lives in: the model may write them; forget deletes them."""
MemoryKind = Literal["fact", "preference", "rule", "note"]
MEMORY_KINDS: tuple[MemoryKind, ...] = ("fact", "preference", "rule", "note")
CHUNK = "chunk"
"""The kind of a knowledge chunk (a record with a non-empty ``collection``)."""

_SEP = "\x1f"  # cannot occur in a tenant, user, agent or session id the API accepts


@dataclass(frozen=True, slots=True)
class Namespace:
    """One scope's bucket: ``session`` (tenant, owner, session), ``user`` (tenant, owner),
    ``agent`` (tenant, agent name) or ``tenant`` (tenant)."""

    scope: Scope
    tenant: str
    owner: str = ""
    agent: str = ""
    session_id: str = ""

    @property
    def key(self) -> str:
        """The string the store indexes a namespace by (unambiguous: fields are separated by a
        control character no id may contain)."""
        return _SEP.join((self.scope, self.tenant, self.owner, self.agent, self.session_id))

    @classmethod
    def from_key(cls, key: str) -> Namespace:
        scope, tenant, owner, agent, session_id = key.split(_SEP)
        if scope not in SCOPES:
            raise ValueError(f"not a namespace key: {key!r}")
        return cls(scope, tenant, owner, agent, session_id)

    @classmethod
    def session(cls, key: SessionKey) -> Namespace:
        return cls("session", key.tenant, owner=key.owner, session_id=key.session_id)

    @classmethod
    def user(cls, tenant: str, user: str) -> Namespace:
        return cls("user", tenant, owner=user)

    @classmethod
    def of_agent(cls, tenant: str, agent: str) -> Namespace:
        return cls("agent", tenant, agent=agent)

    @classmethod
    def of_tenant(cls, tenant: str) -> Namespace:
        return cls("tenant", tenant)

    @classmethod
    def for_principal(
        cls,
        principal: Principal,
        scope: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
    ) -> Namespace:
        """The namespace of ``scope`` as ``principal`` sees it (its own user, its own tenant)."""
        if scope == "session":
            if not session_id:
                raise InvalidInput("session scope needs a session_id")
            return cls.session(SessionKey.of(principal, session_id))
        if scope == "user":
            return cls.user(principal.tenant, principal.user)
        if scope == "agent":
            if not agent:
                raise InvalidInput("agent scope needs an agent name")
            return cls.of_agent(principal.tenant, agent)
        if scope == "tenant":
            return cls.of_tenant(principal.tenant)
        raise InvalidInput(f"unknown memory scope {scope!r}; one of {', '.join(SCOPES)}")

    def readable_by(self, principal: Principal) -> bool:
        if self.tenant != principal.tenant:
            return False
        if self.scope in ("session", "user"):
            return self.owner == principal.user
        return True  # agent and tenant memory is shared by everyone in the tenant

    def writable_by(self, principal: Principal) -> bool:
        """Own session and user memory; agent and tenant memory only for admins."""
        if not self.readable_by(principal):
            return False
        return self.scope in ("session", "user") or principal.is_admin


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """A memory item (``collection == ""``) or a knowledge chunk (``collection`` names it)."""

    id: str
    namespace: Namespace
    kind: str
    content: str
    collection: str = ""
    document_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """Provenance: ``session_id``, ``turn_id``, ``author`` (who wrote it: a user id, ``model``
    for the remember tool, ``auto`` for automatic notes); for chunks ``document``, ``chunk``,
    ``page``."""
    revision: int = 1
    created_at: float = 0.0
    updated_at: float = 0.0
    seq: int = 0
    """Assigned by the store: insertion order, the cursor of listings and search results."""


@dataclass(frozen=True, slots=True)
class Document:
    """A knowledge document as ingested: its chunks are records of its collection."""

    id: str
    namespace: Namespace
    collection: str
    name: str
    media_type: str
    chunks: int
    chars: int
    created_at: float
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class VectorSnapshot:
    """Every embedding of one namespace's collection, as of ``version``."""

    version: int
    seqs: list[int]
    vectors: list[bytes]
    """float32, one blob per record, in the order of ``seqs``."""


@dataclass(frozen=True, slots=True)
class ForgetReport:
    sessions: int = 0
    memory: int = 0
    documents: int = 0


@dataclass(frozen=True, slots=True)
class Hit:
    """One result of a memory or knowledge search."""

    record: MemoryRecord
    score: float
    """Reciprocal-rank-fusion score (higher is better; comparable within one search only)."""


@dataclass(frozen=True, slots=True)
class MemoryWrites:
    """What a turn wrote to memory, applied by its ending in the same transaction (DESIGN §3).

    ``put`` holds new records with their embeddings, ``delete`` the records they replace. The
    store applies them only when the ending keeps the turn's items, so a failed or rolled-back
    turn leaves no note behind, and a turn that lost its lease writes none.
    """

    put: tuple[tuple[MemoryRecord, bytes], ...] = ()
    delete: tuple[tuple[Namespace, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)
