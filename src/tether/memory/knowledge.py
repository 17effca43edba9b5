"""Knowledge: documents parsed, chunked, embedded and stored in named collections (DESIGN §8).

The document half of :class:`~tether.memory.service.MemoryService`, which delegates to it. It is
handed namespaces the service has already built from a principal and checked, so nothing here
decides who may read or write what; it only turns bytes into searchable chunks and back.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from tether.errors import DocumentNotFound, InvalidInput
from tether.memory.budget import Budget, IngestLimits
from tether.memory.documents import parse_and_chunk
from tether.memory.embed import Vectors, to_blob
from tether.records import (
    CHUNK,
    Document,
    Hit,
    MemoryRecord,
    Namespace,
    new_document_id,
    new_memory_id,
)
from tether.store.protocol import RecallStore

COLLECTION_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
EMBED_BATCH = 256
"""Chunks embedded per call: a progress report after each batch."""


def check_collection(name: str) -> str:
    if not isinstance(name, str) or COLLECTION_PATTERN.fullmatch(name) is None:
        raise InvalidInput("a collection name is 1-64 characters of letters, digits and '._-'")
    return name


Embed = Callable[[Sequence[str]], Awaitable[Vectors]]
"""Texts to vectors: the service's embedder, resolved on first use."""
Reserve = Callable[[int], AbstractAsyncContextManager[None]]
"""Room for this many bytes of records, held while they are written (or an error refusing it)."""


def record_bytes(record: MemoryRecord, embedding: bytes) -> int:
    """What a record takes in a store, as :meth:`RecallStore.storage_used` counts it: its text
    (UTF-8) and its embedding."""
    return len(record.content.encode()) + len(embedding)


class Search(Protocol):
    """Hybrid search of one collection (:meth:`MemoryService.search`)."""

    async def __call__(
        self, namespaces: Sequence[Namespace], query: str, *, collection: str, limit: int
    ) -> list[Hit]: ...


class KnowledgeService:
    """Documents and their chunks, in collections of a namespace.

    :meth:`add_document` and :meth:`delete_document` take a collection name the caller has
    checked (:func:`check_collection`); :meth:`search` checks each name it is given.
    """

    def __init__(self, store: RecallStore, embed: Embed, search: Search) -> None:
        self.store = store
        self._embed = embed
        self._search = search

    async def add_document(
        self,
        ns: Namespace,
        collection: str,
        data: bytes,
        *,
        name: str,
        media_type: str | None,
        author: str,
        progress: Callable[[int, int], None] | None = None,
        limits: IngestLimits | None = None,
        reserve: Reserve | None = None,
    ) -> Document:
        """Parse, chunk, embed and store one document (text, Markdown, HTML or PDF) in ``ns``.

        Within ``limits`` (default: :class:`IngestLimits`'s; :class:`TooLarge` past any of them,
        before anything is stored);
        ``reserve``, if given, is entered with the bytes the document's records take around the
        one transaction that stores them, and may refuse them (a storage quota).
        """
        budget = Budget(name, limits)
        # Parsing a large PDF takes a while: off the event loop, so other requests go on.
        parsed, chunks = await asyncio.to_thread(parse_and_chunk, name, data, media_type, budget)
        if not chunks:
            raise InvalidInput(f"{name}: no text to index")
        doc_id, now = new_document_id(), time.time()
        vectors: list[Vectors] = []
        for start in range(0, len(chunks), EMBED_BATCH):
            budget.check_time()
            batch = chunks[start : start + EMBED_BATCH]
            vectors.extend(await self._embed([c.text for c in batch]))
            if progress is not None:
                progress(min(start + EMBED_BATCH, len(chunks)), len(chunks))
        records = []
        for chunk, vector in zip(chunks, vectors, strict=True):
            meta: dict[str, Any] = {"document": parsed.name, "chunk": chunk.index}
            if chunk.page is not None:
                meta["page"] = chunk.page
            if chunk.heading:
                meta["heading"] = chunk.heading
            record = MemoryRecord(
                id=new_memory_id(),
                namespace=ns,
                kind=CHUNK,
                content=chunk.text,
                collection=collection,
                document_id=doc_id,
                meta={**meta, "author": author},
                created_at=now,
                updated_at=now,
            )
            records.append((record, to_blob(vector)))
        document = Document(
            id=doc_id,
            namespace=ns,
            collection=collection,
            name=parsed.name,
            media_type=parsed.media_type,
            chunks=len(chunks),
            chars=sum(len(p) for p in parsed.pages),
            created_at=now,
        )
        budget.check_time()
        if reserve is None:
            stored = await self.store.add_document(document, records)
        else:
            async with reserve(sum(record_bytes(r, blob) for r, blob in records)):
                stored = await self.store.add_document(document, records)
        # Adding a document again (same name, same collection and scope) replaces it: re-running
        # an ingestion must not double every passage. The new one is in before the old goes,
        # so a search in between finds one or the other, never neither.
        for old in await self.store.list_documents(ns, collection=collection):
            if old.name == document.name and old.id != doc_id:
                await self.store.delete_document(ns, collection, old.id)
        return stored

    async def list_documents(self, ns: Namespace, collection: str | None) -> list[Document]:
        return await self.store.list_documents(ns, collection=collection)

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> None:
        if not await self.store.delete_document(ns, collection, document_id):
            raise DocumentNotFound("document not found")

    async def search(
        self,
        namespaces: Sequence[Namespace],
        query: str,
        collections: Sequence[str],
        *,
        limit: int = 5,
    ) -> list[Hit]:
        """Hybrid search of the named collections across ``namespaces``, fused into one list."""
        hits: list[Hit] = []
        for collection in collections:
            hits.extend(
                await self._search(
                    namespaces, query, collection=check_collection(collection), limit=limit
                )
            )
        hits.sort(key=lambda h: -h.score)
        return hits[:limit]
