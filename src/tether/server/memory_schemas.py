"""Wire models of the memory, knowledge and user-data routes (the core uses dataclasses)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tether.memory.service import MAX_QUERY_CHARS
from tether.records import Document, Hit, MemoryKind, MemoryRecord, Scope
from tether.server.schemas import MAX_INT64, SESSION_ID, Wire, without_null

ScopeName = Scope
KindName = MemoryKind
MAX_SEARCH_LIMIT = 50
# Documented, not enforced: SessionKey.of checks ids, so a bad one is a 400 wherever it is.
SESSION_ID_DOC: dict[str, Any] = {"pattern": SESSION_ID, "minLength": 1, "maxLength": 128}

# What the routes and the memory service check, stated in the schema (documented, not enforced
# by pydantic, so that each refusal keeps its status: 400 ``invalid-input`` as everywhere else).
# The patterns read as Python's ``re`` reads them (``\s`` is ``str.isspace``), which is how the
# server checks; JSON Schema's ECMA-262 ``\s`` lacks a few of those, so they are named too.
AGENT_DOC: dict[str, Any] = {"minLength": 1, "pattern": r"^[^\x00-\x1f\x7f]*$"}
"""An agent name: 1-128 characters, no control characters (:func:`routes.memory.check_agent`)."""
CONTENT_DOC: dict[str, Any] = {"pattern": r"^[^\x00]*[^\s\x00\x1c-\x1f\x85][^\x00]*$"}
"""Memory content: something besides whitespace, no NUL. (Its 8,000 characters are a size bound,
answered 413 like the others, and stated with the 413 rather than as a ``maxLength``, whose
violation a schema-driven client expects to get a 400 or 422 for.)"""
QUERY_DOC: dict[str, Any] = {"pattern": r"[^\s\x1c-\x1f\x85]"}
"""A search: something besides whitespace."""
MEDIA_TYPE_DOC: dict[str, Any] = {"pattern": r"^[ \t]*([Tt][Ee][Xx][Tt]/[^;]*)?(;.*)?$"}
"""A text type, any parameters after it (the text is decoded already: a charset is moot)."""
DOCUMENT_TEXT_DOC: dict[str, Any] = {
    "pattern": r"^[^\x00]*[^\s\x00-\x08\x0e-\x1f\x7f\x85\u00ad\ufeff][^\x00]*$"
}
"""A document's text: no NUL, and one character the chunker keeps (not whitespace, not an
invisible control, soft hyphen or BOM: :mod:`tether.memory.chunks`)."""


def scope_rule(*, required: bool = False) -> dict[str, Any]:
    """The JSON Schema of ``{scope, session_id, agent}``: session scope needs a ``session_id``,
    agent scope an ``agent``, both strings."""

    def needs(scope: str, name: str) -> dict[str, Any]:
        return {
            "if": {"properties": {"scope": {"const": scope}}, "required": ["scope"]},
            "then": {"required": [name], "properties": {name: {"type": "string"}}},
        }

    rule: dict[str, Any] = {"allOf": [needs("session", "session_id"), needs("agent", "agent")]}
    if required:
        rule["required"] = ["scope"]
    return rule


_SCOPE = "session (needs session_id), user, agent (needs agent) or tenant."
_SESSION_ID_FIELD: Any = Field(
    None,
    description="A session of yours: required for session scope.",
    json_schema_extra=SESSION_ID_DOC,
)
_AGENT_FIELD: Any = Field(
    None,
    max_length=128,
    description="An agent name: required for agent scope.",
    json_schema_extra=AGENT_DOC,
)
_SCOPED = ConfigDict(extra="forbid", json_schema_extra=scope_rule())


class MemoryCreate(Wire):
    model_config = _SCOPED
    content: str = Field(
        ...,
        min_length=1,
        description="The text to remember (data, never orders).",
        json_schema_extra=CONTENT_DOC,
    )
    scope: ScopeName = Field("user", description=_SCOPE + " Agent and tenant: admins only.")
    kind: KindName = "fact"
    session_id: str | None = _SESSION_ID_FIELD
    agent: str | None = _AGENT_FIELD


class MemoryPatch(Wire):
    content: str = Field(..., min_length=1, json_schema_extra=CONTENT_DOC)
    kind: KindName | None = Field(None, description="Omit to keep the item's kind.")
    expected_revision: int | None = Field(
        None,
        ge=1,
        le=MAX_INT64,
        description="The revision you read; required here or as an If-Match header (else 428).",
    )


class MemorySearch(Wire):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra=QUERY_DOC)
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

    model_config = _SCOPED
    text: str = Field(..., min_length=1, json_schema_extra=DOCUMENT_TEXT_DOC)
    name: str | None = Field(
        None, min_length=1, max_length=256, description="Default ``text``; its extension counts."
    )
    media_type: str | None = Field(
        None,
        max_length=128,
        description="text/plain, text/markdown, text/html or another text type (parameters "
        "are ignored); default: from the name, else plain text.",
        json_schema_extra=MEDIA_TYPE_DOC,
    )
    scope: ScopeName = Field("user", description=_SCOPE + " Agent and tenant: admins only.")
    session_id: str | None = _SESSION_ID_FIELD
    agent: str | None = _AGENT_FIELD


class DocumentForm(Wire):
    """The form fields that may come with a multipart ``file``."""

    scope: ScopeName = "user"
    session_id: str | None = None
    agent: str | None = Field(None, max_length=128, json_schema_extra=AGENT_DOC)


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


class CollectionOut(BaseModel):
    name: str
    documents: int
    chunks: int
    chars: int


class CollectionList(BaseModel):
    """The collections of one scope that hold documents, by name."""

    data: list[CollectionOut]


class KnowledgeSearch(Wire):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY_CHARS, json_schema_extra=QUERY_DOC)
    limit: int = Field(5, ge=1, le=MAX_SEARCH_LIMIT)
    session_id: str | None = Field(
        None,
        description="Also search this session's documents (a session of yours).",
        json_schema_extra=SESSION_ID_DOC,
    )
    agent: str | None = Field(
        None,
        max_length=128,
        description="Also search this agent's documents.",
        json_schema_extra=AGENT_DOC,
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


# -- OpenAPI -------------------------------------------------------------------------------------
SCOPE_PARAMETERS = ("scope", "session_id", "agent")


def _query_schema(parameter: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema as an object property: a query string has no null."""
    schema = without_null(dict(parameter["schema"]))
    if parameter.get("description"):
        schema["description"] = parameter["description"]
    return schema


def merge_scope_parameters(operation: dict[str, Any]) -> None:
    """State the scope rule of ``?scope=&session_id=&agent=`` in an operation's OpenAPI.

    OpenAPI cannot make one query parameter depend on another, but one object parameter, sent
    exploded (``style: form``: the same ``?scope=session&session_id=…``), has a schema that can:
    :func:`scope_rule`. Operations without all three parameters are left as they are.
    """
    parameters: list[dict[str, Any]] = operation.get("parameters", [])
    scoped = {
        p["name"]: p for p in parameters if p.get("in") == "query" and p["name"] in SCOPE_PARAMETERS
    }
    if set(scoped) != set(SCOPE_PARAMETERS):
        return
    required = bool(scoped["scope"].get("required"))
    target = {
        "name": "target",
        "in": "query",
        "style": "form",
        "explode": True,
        "required": required,
        "description": "Whose records: " + _SCOPE,
        "schema": {
            "type": "object",
            "properties": {name: _query_schema(scoped[name]) for name in SCOPE_PARAMETERS},
            # No additionalProperties: false — other query parameters are ignored here, as on
            # every route, and the schema must not promise a refusal the server never makes.
            **scope_rule(required=required),
        },
    }
    operation["parameters"] = [p for p in parameters if p["name"] not in scoped] + [target]
