"""Knowledge: documents (text, Markdown, HTML, PDF) chunked into named collections, searched.

A document lives in one scope like memory does (default: the caller's user scope). A search of a
collection covers every scope the caller may read: their user scope, the tenant's, and the
session's and agent's when the request names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException

from tether.errors import DocumentNotFound, InvalidInput, TooLarge
from tether.memory.documents import MAX_DOCUMENT_BYTES
from tether.memory.knowledge import check_collection
from tether.memory.parse import HTML, MARKDOWN, PDF, TEXT
from tether.memory.service import MemoryService
from tether.records import SCOPES
from tether.server.deps import Caller, State
from tether.server.memory_schemas import (
    AGENT_DOC,
    SESSION_ID_DOC,
    CollectionList,
    CollectionOut,
    DocumentForm,
    DocumentList,
    DocumentOut,
    DocumentText,
    KnowledgeHit,
    KnowledgeHits,
    KnowledgeSearch,
    ScopeName,
    scope_rule,
)
from tether.server.problems import Problem, responses
from tether.server.routes.memory import (
    FORBIDDEN,
    NOT_FOUND_TARGET,
    AgentQuery,
    SessionIdQuery,
    check_target,
)
from tether.server.schemas import minted

router = APIRouter(prefix="/v1/knowledge", tags=["knowledge"])

UPLOAD_PATH = re.compile(r"/v1/knowledge/[^/]+/documents/?")
"""The one route whose bodies may be larger than the server's ``max_body_bytes``."""
MAX_UPLOAD_BYTES = MAX_DOCUMENT_BYTES + 64 * 1024
"""A document at the parser's bound, plus room for the multipart envelope and form fields."""
MAX_NAME_CHARS = 256

CollectionPath = Annotated[
    str,
    Path(
        description="Collection name: 1-64 of [A-Za-z0-9._-].",
        json_schema_extra={"pattern": r"^[A-Za-z0-9._-]{1,64}$", "minLength": 1, "maxLength": 64},
    ),
]
TOO_LARGE = f"the document is over {MAX_DOCUMENT_BYTES} bytes"
UNSUPPORTED = "the body is neither multipart/form-data nor application/json"


@dataclass(frozen=True, slots=True)
class _Upload:
    data: bytes
    name: str
    media_type: str | None
    scope: ScopeName
    session_id: str | None
    agent: str | None


def _clean_name(name: str | None, default: str) -> str:
    """A file name as shown back: its last path component, no control characters, bounded."""
    base = PurePosixPath((name or "").replace("\\", "/")).name
    base = "".join(ch for ch in base if ord(ch) >= 32 and ord(ch) != 127).strip()
    return base[:MAX_NAME_CHARS] or default


def _invalid(exc: ValidationError) -> RequestValidationError:
    """The route validates its body itself: its errors become the usual 422 problem."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    return RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors])


def _missing_file() -> RequestValidationError:
    return RequestValidationError(
        [{"type": "missing", "loc": ("body", "file"), "msg": "a multipart 'file' is required"}]
    )


async def _from_json(request: Request) -> _Upload:
    body = await request.body()
    try:
        doc = DocumentText.model_validate_json(body)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise Problem(
                400, "malformed-json", "Malformed JSON", "the request body is not valid JSON"
            ) from None
        raise _invalid(exc) from None
    data = doc.text.encode("utf-8", errors="surrogatepass")
    if len(data) > MAX_DOCUMENT_BYTES:
        raise TooLarge(TOO_LARGE)
    return _Upload(
        data=data,
        name=_clean_name(doc.name, "text"),
        # Already decoded once: whatever charset the caller named, these bytes are UTF-8.
        media_type=doc.media_type.split(";")[0] if doc.media_type else None,
        scope=doc.scope,
        session_id=doc.session_id,
        agent=doc.agent,
    )


async def _from_form(request: Request) -> _Upload:
    try:
        async with request.form(max_files=1, max_fields=8, max_part_size=4096) as form:
            files = form.getlist("file")
            fields: dict[str, Any] = {}
            for key, value in form.multi_items():
                if key == "file":
                    continue
                if key in fields:
                    raise InvalidInput(f"form field {key!r} is given twice")
                fields[key] = value
            if len(files) != 1 or not isinstance(files[0], UploadFile):
                raise _missing_file()
            upload = files[0]
            data = await upload.read(MAX_DOCUMENT_BYTES + 1)
            name, declared = upload.filename, upload.content_type
    except StarletteHTTPException:
        # Starlette's word for a multipart body it could not parse (or one over its bounds).
        raise InvalidInput("the multipart body is malformed or has too many parts") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise TooLarge(TOO_LARGE)
    if any(not isinstance(v, str) for v in fields.values()):
        raise InvalidInput("only 'file' may be a file")
    try:
        form_fields = DocumentForm.model_validate(fields)
    except ValidationError as exc:
        raise _invalid(exc) from None
    return _Upload(
        data=data,
        name=_clean_name(name, "upload"),
        media_type=declared,
        scope=form_fields.scope,
        session_id=form_fields.session_id,
        agent=form_fields.agent,
    )


FILE_TYPES = ", ".join((TEXT, MARKDOWN, HTML, PDF))
"""The part types the schema names (other ``text/*`` parts and unlabelled ones are read too)."""


def _upload_body() -> dict[str, Any]:
    form = {
        "type": "object",
        "required": ["file"],
        "properties": {
            "file": {
                "type": "string",
                "format": "binary",
                "description": "The document: UTF-8 text, Markdown, HTML or a PDF, with some "
                "text to index (the part's content type says which).",
            },
            "scope": {"type": "string", "enum": list(SCOPES), "default": "user"},
            "session_id": {"type": "string", **SESSION_ID_DOC},
            "agent": {"type": "string", "maxLength": 128, **AGENT_DOC},
        },
        "additionalProperties": False,
        **scope_rule(),
    }
    json_schema = DocumentText.model_json_schema()
    json_schema.pop("title", None)
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": form,
                    "encoding": {"file": {"contentType": FILE_TYPES}},
                },
                "application/json": {"schema": json_schema},
            },
        }
    }


@router.post(
    "/{collection}/documents",
    status_code=201,
    openapi_extra=_upload_body(),
    responses=responses(
        400,
        422,
        e403=FORBIDDEN,
        e404=NOT_FOUND_TARGET,
        e413=f"the body or the document is too large (documents: {MAX_DOCUMENT_BYTES} bytes;"
        " their text, chunks and reading time are bounded too), or it would take you past your"
        " storage quota (type storage-quota)",
        e415=UNSUPPORTED,
        e429="too many of your documents are being read in at once (see Retry-After)",
    ),
)
async def add_document(
    collection: CollectionPath, request: Request, st: State, caller: Caller
) -> DocumentOut:
    """Add a document to a collection: a multipart ``file`` (with optional ``scope``,
    ``session_id``, ``agent`` fields) or JSON ``{text, name?, media_type?, scope?, …}``.

    Text, Markdown, HTML and PDF; the type comes from the part's content type, else the file
    name, else the bytes. The document is parsed, chunked and embedded before the answer.
    """
    check_collection(collection)  # before reading a body of up to 20 MB
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind not in ("multipart/form-data", "application/json"):
        raise Problem(415, "unsupported-media-type", "Unsupported media type", UNSUPPORTED)
    # Both bounds before the body is read: a user past either costs us no parsing.
    async with st.quotas.ingestion(caller):
        await st.quotas.ensure_room(caller)
        upload = await (
            _from_form(request) if kind == "multipart/form-data" else _from_json(request)
        )
        await check_target(
            st,
            caller,
            session_id=upload.session_id,
            agent=upload.agent,
            scope=upload.scope,
            write=True,
        )
        document = await st.runtime.memory.add_document(
            caller,
            collection,
            upload.data,
            name=upload.name,
            media_type=upload.media_type,
            scope=upload.scope,
            session_id=upload.session_id,
            agent=upload.agent,
            limits=st.settings.limits.ingest,
            reserve=lambda size: st.quotas.reserve(caller, size),
        )
    return DocumentOut.of(document)


@router.get("", responses=responses(400, e404=NOT_FOUND_TARGET))
async def list_collections(
    st: State,
    caller: Caller,
    scope: Annotated[ScopeName, Query(description="Whose collections (default: yours).")] = "user",
    session_id: SessionIdQuery = None,
    agent: AgentQuery = None,
) -> CollectionList:
    """The collections that hold documents in one scope, by name, with their sizes (what the
    console offers to browse)."""
    await check_target(st, caller, session_id=session_id, agent=agent)
    documents = await st.runtime.memory.list_documents(
        caller, collection=None, scope=scope, session_id=session_id, agent=agent
    )
    sizes: dict[str, CollectionOut] = {}
    for d in documents:
        c = sizes.setdefault(
            d.collection, CollectionOut(name=d.collection, documents=0, chunks=0, chars=0)
        )
        c.documents += 1
        c.chunks += d.chunks
        c.chars += d.chars
    return CollectionList(data=[sizes[name] for name in sorted(sizes)])


@router.get("/{collection}/documents", responses=responses(400, e404=NOT_FOUND_TARGET))
async def list_documents(
    collection: CollectionPath,
    st: State,
    caller: Caller,
    scope: Annotated[ScopeName, Query(description="Whose documents (default: yours).")] = "user",
    session_id: SessionIdQuery = None,
    agent: AgentQuery = None,
) -> DocumentList:
    """The collection's documents in one scope, oldest first."""
    check_collection(collection)
    await check_target(st, caller, session_id=session_id, agent=agent)
    documents = await st.runtime.memory.list_documents(
        caller, collection=collection, scope=scope, session_id=session_id, agent=agent
    )
    return DocumentList(data=[DocumentOut.of(d) for d in documents])


@router.delete(
    "/{collection}/documents/{doc_id}",
    status_code=204,
    responses=responses(400, 404, e403=FORBIDDEN),
)
async def delete_document(
    collection: CollectionPath,
    doc_id: Annotated[str, Path(description="A document id (``doc_…``).")],
    st: State,
    caller: Caller,
    scope: Annotated[ScopeName, Query(description="The document's scope.")] = "user",
    session_id: SessionIdQuery = None,
    agent: AgentQuery = None,
) -> Response:
    """Delete a document and its chunks."""
    check_collection(collection)
    await check_target(st, caller, session_id=session_id, agent=agent)
    if not minted(doc_id):
        raise DocumentNotFound("document not found")
    await st.runtime.memory.delete_document(
        caller, collection, doc_id, scope=scope, session_id=session_id, agent=agent
    )
    return Response(status_code=204)


@router.post("/{collection}/search", responses=responses(400, e404=NOT_FOUND_TARGET))
async def search_knowledge(
    collection: CollectionPath, body: KnowledgeSearch, st: State, caller: Caller
) -> KnowledgeHits:
    """Hybrid search of the collection in every scope you may read, best first."""
    check_collection(collection)
    await check_target(st, caller, session_id=body.session_id, agent=body.agent)
    namespaces = MemoryService.readable(
        caller, SCOPES, session_id=body.session_id, agent=body.agent
    )
    hits = await st.runtime.memory.search_knowledge(
        namespaces, body.query, [collection], limit=body.limit
    )
    return KnowledgeHits(data=[KnowledgeHit.of(h) for h in hits])
