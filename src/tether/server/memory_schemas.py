"""Wire models of the memory, knowledge and user-data routes (the core uses dataclasses)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from tether.memory.service import MAX_QUERY_CHARS
from tether.records import Document, Hit, MemoryKind, MemoryRecord, Scope
from tether.server.schemas import SESSION_ID, Wire

ScopeName = Scope
KindName = MemoryKind
MAX_SEARCH_LIMIT = 50
# Documented, not enforced: SessionKey.of checks ids, so a bad one is a 400 wherever it is.
SESSION_ID_DOC: dict[str, Any] = {"pattern": SESSION_ID, "minLength": 1, "maxLength": 128}

_SCOPE = "session (needs session_id), user, agent (needs agent) or tenant."
_SESSION_ID_FIELD: Any = Field(
    None,
    description="A session of yours: required for session scope.",
    json_schema_extra=SESSION_ID_DOC,
)
_AGENT_FIELD: Any = Field(
    None, max_length=128, description="An agent name: required for agent scope."
)


class MemoryCreate(Wire):
    content: str = Field(
        ..., min_length=1, description="The text to remember (data, never orders)."
    )
    scope: ScopeName = Field("user", description=_SCOPE + " Agent and tenant: admins only.")
    kind: KindName = "fact"
    session_id: str | None = _SESSION_ID_FIELD
    agent: str | None = _AGENT_FIELD


class MemoryPatch(Wire):
    content: str = Field(..., min_length=1)
    kind: KindName | None = Field(None, description="Omit to keep the item's kind.")
    expected_revision: int | None = Field(
        None,
        ge=1,
        le=2**63 - 1,
        description="The revision you read; required here or as an If-Match header.",
    )


class MemorySearch(Wire):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS)
    scopes: list[ScopeName] | None = Field(
        None,
        min_length=1,
        max_length=4,
        description="Default: every scope you may read (session with session_id, agent with "
        "agent).",
    )
    session_id: str | None = _SESSION_ID_FIELD
    agent: str | None = _AGENT_FIELD
    limit: int = Field(10, ge=1, le=MAX_SEARCH_LIMIT)


class Provenance(BaseModel):
    session_id: str | None
    """The session the item was written in, if any."""
    turn_id: str | None
    """The turn that wrote it (the ``remember`` tool, automatic notes)."""
    author: str | None
    """A user id, ``model`` (the remember tool) or ``auto`` (automatic notes)."""


class MemoryOut(BaseModel):
    id: str
    scope: ScopeName
    kind: str
    content: str
    revision: int
    created_at: float
    updated_at: float
    provenance: Provenance

    @classmethod
    def of(cls, r: MemoryRecord) -> MemoryOut:
        meta = r.meta

        def text(name: str) -> str | None:
            value = meta.get(name)
            return value if isinstance(value, str) else None

        return cls(
            id=r.id,
            scope=r.namespace.scope,
            kind=r.kind,
            content=r.content,
            revision=r.revision,
            created_at=r.created_at,
            updated_at=r.updated_at,
            provenance=Provenance(
                session_id=text("session_id"), turn_id=text("turn_id"), author=text("author")
            ),
        )


class MemoryPage(BaseModel):
    data: list[MemoryOut]
    next_cursor: str | None


class MemoryHit(BaseModel):
    item: MemoryOut
    score: float
    """Rank-fusion score: higher is better, comparable within one search only."""


class MemoryHits(BaseModel):
    data: list[MemoryHit]

    @classmethod
    def of(cls, hits: list[Hit]) -> MemoryHits:
        return cls(data=[MemoryHit(item=MemoryOut.of(h.record), score=h.score) for h in hits])


class Cleared(BaseModel):
    deleted: int


# -- knowledge ----------------------------------------------------------------------------------
class DocumentText(Wire):
    """A document sent as JSON text (the alternative to a multipart ``file``)."""

    text: str = Field(..., min_length=1)
    name: str | None = Field(
        None, min_length=1, max_length=256, description="Default ``text``; its extension counts."
    )
    media_type: str | None = Field(
        None,
        max_length=128,
        description="text/plain, text/markdown or text/html (may carry a charset); default: "
        "from the name, else plain text.",
    )
    scope: ScopeName = Field("user", description=_SCOPE + " Agent and tenant: admins only.")
    session_id: str | None = _SESSION_ID_FIELD
    agent: str | None = _AGENT_FIELD


class DocumentForm(Wire):
    """The form fields that may come with a multipart ``file``."""

    scope: ScopeName = "user"
    session_id: str | None = None
    agent: str | None = Field(None, max_length=128)


class DocumentOut(BaseModel):
    id: str
    collection: str
    name: str
    media_type: str
    chunks: int
    chars: int
    scope: ScopeName
    created_at: float

    @classmethod
    def of(cls, d: Document) -> DocumentOut:
        return cls(
            id=d.id,
            collection=d.collection,
            name=d.name,
            media_type=d.media_type,
            chunks=d.chunks,
            chars=d.chars,
            scope=d.namespace.scope,
            created_at=d.created_at,
        )


class DocumentList(BaseModel):
    data: list[DocumentOut]


class KnowledgeSearch(Wire):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS)
    limit: int = Field(5, ge=1, le=MAX_SEARCH_LIMIT)
    session_id: str | None = Field(
        None,
        description="Also search this session's documents (a session of yours).",
        json_schema_extra=SESSION_ID_DOC,
    )
    agent: str | None = Field(
        None, max_length=128, description="Also search this agent's documents."
    )


class KnowledgeHit(BaseModel):
    content: str
    """The chunk's text."""
    document: str | None
    """The document's name."""
    document_id: str | None
    page: int | None
    """1-based page of a PDF; null for other documents."""
    chunk: int | None
    """The chunk's index within its document (0-based)."""
    heading: str | None
    """The nearest Markdown or HTML heading above the chunk."""
    scope: ScopeName
    score: float

    @classmethod
    def of(cls, h: Hit) -> KnowledgeHit:
        meta = h.record.meta
        page, chunk = meta.get("page"), meta.get("chunk")
        name, heading = meta.get("document"), meta.get("heading")
        return cls(
            content=h.record.content,
            document=name if isinstance(name, str) else None,
            document_id=h.record.document_id,
            page=page if isinstance(page, int) else None,
            chunk=chunk if isinstance(chunk, int) else None,
            heading=heading if isinstance(heading, str) else None,
            scope=h.record.namespace.scope,
            score=h.score,
        )


class KnowledgeHits(BaseModel):
    data: list[KnowledgeHit]


# -- users --------------------------------------------------------------------------------------
class Forgotten(BaseModel):
    """What ``DELETE /v1/users/me/data`` deleted."""

    sessions: int
    memory: int
    documents: int
