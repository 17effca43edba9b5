"""The memory service: scoped memory and knowledge for principals, over any store.

Everything here starts from a :class:`Principal`: the namespaces a call may touch are built from
it (its tenant, its user, sessions it owns), never taken from request text, so one user's call
cannot name another user's memory. Agent and tenant memory is readable by everyone in the tenant
and writable by admins only (:class:`Forbidden`); a record the caller may not read is
:class:`MemoryNotFound`, the same answer as one that does not exist.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from tether.errors import (
    Forbidden,
    InvalidInput,
    MemoryNotFound,
    SessionNotFound,
    TooLarge,
)
from tether.memory.budget import IngestLimits
from tether.memory.embed import (
    Embedder,
    Vectors,
    WordLlamaEmbedder,
    check_embedder,
    resolve_embedder,
    to_blob,
)
from tether.memory.knowledge import KnowledgeService, Reserve, check_collection
from tether.memory.search import VectorIndex, fuse, query_terms
from tether.records import (
    MEMORY_KINDS,
    SCOPES,
    Document,
    ForgetReport,
    Hit,
    MemoryRecord,
    Namespace,
    Principal,
    SessionKey,
    new_memory_id,
)
from tether.store.protocol import RecallBackend

log = logging.getLogger("tether.memory")

MAX_MEMORY_CHARS = 8_000
MAX_QUERY_CHARS = 2_000
CANDIDATES = 50
"""Candidates each half of a hybrid search contributes before fusion."""
MIN_SIMILARITY = 0.25
"""A record found only by vector needs at least this cosine: below it, it is noise."""


def _check_content(content: str) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("memory content must be non-empty text")
    if len(content) > MAX_MEMORY_CHARS:
        raise TooLarge(f"memory content is over {MAX_MEMORY_CHARS} characters")
    if "\x00" in content:
        raise InvalidInput("memory content must not contain NUL characters")
    return content


def _check_kind(kind: str) -> str:
    if kind not in MEMORY_KINDS:
        raise InvalidInput(f"memory kind must be one of {', '.join(MEMORY_KINDS)}")
    return kind


class MemoryService:
    def __init__(
        self,
        store: RecallBackend,
        *,
        embedder: Embedder | str | None = None,
        index: VectorIndex | None = None,
    ) -> None:
        self.store = store
        if isinstance(embedder, str) and embedder not in ("", "wordllama", "default"):
            check_embedder(embedder)  # TETHER_EMBEDDER=bogus stops a server as it starts
        self._embedder_spec = embedder
        self._embedder: Embedder | None = None
        self.index = index or VectorIndex()
        self._knowledge = KnowledgeService(store, self._embed, self.search)

    async def close(self) -> None:
        """Close an embedder this service made from a spec (one passed in is the caller's)."""
        if self._embedder is not None and self._embedder is not self._embedder_spec:
            closer = getattr(self._embedder, "aclose", None)
            if closer is not None:
                await closer()
            self._embedder = None

    async def warm(self) -> None:
        """Load the default embedder's weights in a thread, so no turn waits for them."""
        try:
            embedder = self.embedder
            if isinstance(embedder, WordLlamaEmbedder):
                await asyncio.to_thread(embedder.load)
        except Exception:  # the first search reports it properly; a server still starts
            log.warning("could not load the embedder", exc_info=True)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = resolve_embedder(self._embedder_spec)
        return self._embedder

    async def _embed(self, texts: Sequence[str]) -> Vectors:
        # Through the property, so the embedder is still resolved on first use (and again after
        # close()), whoever embeds first.
        return await self.embedder.embed(texts)

    # -- namespaces ----------------------------------------------------------------------------
    async def namespace(
        self,
        principal: Principal,
        scope: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        write: bool = False,
    ) -> Namespace:
        """The namespace of ``scope`` for ``principal``; a session must exist and be theirs."""
        ns = Namespace.for_principal(principal, scope, session_id=session_id, agent=agent)
        if (
            ns.scope == "session"
            and await self.store.get_session(SessionKey.of(principal, ns.session_id)) is None
        ):
            raise SessionNotFound("session not found")
        if write and not ns.writable_by(principal):
            raise Forbidden(f"only admins may write {ns.scope} memory")
        return ns

    @staticmethod
    def readable(
        principal: Principal,
        scopes: Sequence[str] = SCOPES,
        *,
        session_id: str | None = None,
        agent: str | None = None,
    ) -> list[Namespace]:
        """The namespaces of ``scopes`` that apply (session needs an id, agent a name)."""
        out: list[Namespace] = []
        for scope in scopes:
            if scope == "session" and not session_id:
                continue
            if scope == "agent" and not agent:
                continue
            out.append(
                Namespace.for_principal(principal, scope, session_id=session_id, agent=agent)
            )
        return out

    async def _locate(self, principal: Principal, record_id: str) -> Namespace:
        ns = await self.store.locate_memory(record_id) if isinstance(record_id, str) else None
        if ns is None or not ns.readable_by(principal):
            raise MemoryNotFound("memory item not found")
        return ns

    # -- memory items --------------------------------------------------------------------------
    async def add(
        self,
        principal: Principal,
        content: str,
        *,
        scope: str = "user",
        kind: str = "fact",
        session_id: str | None = None,
        agent: str | None = None,
        turn_id: str | None = None,
        author: str | None = None,
        namespace: Namespace | None = None,
    ) -> MemoryRecord:
        """Store one memory item. ``namespace`` skips the checks (the turn loop's own writes)."""
        ns = namespace or await self.namespace(
            principal, scope, session_id=session_id, agent=agent, write=True
        )
        record, embedding = await self.prepare(
            principal, content, ns, kind=kind, session_id=session_id, turn_id=turn_id, author=author
        )
        return await self.store.put_memory(record, embedding)

    async def prepare(
        self,
        principal: Principal,
        content: str,
        ns: Namespace,
        *,
        kind: str = "fact",
        session_id: str | None = None,
        turn_id: str | None = None,
        author: str | None = None,
    ) -> tuple[MemoryRecord, bytes]:
        """A new memory item and its embedding, not yet stored: a turn's writes are stored by
        its ending (DESIGN §3)."""
        content, kind = _check_content(content), _check_kind(kind)
        now = time.time()
        meta: dict[str, Any] = {"author": author or principal.user}
        if session_id or ns.session_id:
            meta["session_id"] = session_id or ns.session_id
        if turn_id:
            meta["turn_id"] = turn_id
        record = MemoryRecord(
            id=new_memory_id(),
            namespace=ns,
            kind=kind,
            content=content,
            meta=meta,
            revision=1,
            created_at=now,
            updated_at=now,
        )
        vector = (await self.embedder.embed([content]))[0]
        return record, to_blob(vector)

    async def get(self, principal: Principal, record_id: str) -> MemoryRecord:
        ns = await self._locate(principal, record_id)
        record = await self.store.get_memory(ns, record_id)
        if record is None or record.collection:
            raise MemoryNotFound("memory item not found")
        return record

    async def update(
        self,
        principal: Principal,
        record_id: str,
        *,
        content: str,
        expected_revision: int,
        kind: str | None = None,
    ) -> MemoryRecord:
        """Rewrite an item if it is still at ``expected_revision`` (else RevisionConflict)."""
        content = _check_content(content)
        current = await self.get(principal, record_id)
        if not current.namespace.writable_by(principal):
            raise Forbidden(f"only admins may write {current.namespace.scope} memory")
        vector = (await self.embedder.embed([content]))[0]
        return await self.store.update_memory(
            current.namespace,
            record_id,
            content=content,
            kind=_check_kind(kind) if kind is not None else current.kind,
            embedding=to_blob(vector),
            expected_revision=expected_revision,
            now=time.time(),
        )

    async def delete(self, principal: Principal, record_id: str) -> None:
        current = await self.get(principal, record_id)
        if not current.namespace.writable_by(principal):
            raise Forbidden(f"only admins may write {current.namespace.scope} memory")
        if not await self.store.delete_memory(current.namespace, record_id):
            raise MemoryNotFound("memory item not found")

    async def clear(
        self,
        principal: Principal,
        scope: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
    ) -> int:
        """Delete every memory item of one scope (knowledge stays)."""
        ns = await self.namespace(principal, scope, session_id=session_id, agent=agent, write=True)
        return await self.store.clear_memory(ns, collection="")

    async def list_items(
        self,
        principal: Principal,
        scope: str,
        *,
        session_id: str | None = None,
        agent: str | None = None,
        after: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        ns = await self.namespace(principal, scope, session_id=session_id, agent=agent)
        return await self.store.list_memory([ns], after_seq=after, limit=limit)

    async def search(
        self,
        namespaces: Sequence[Namespace],
        query: str,
        *,
        collection: str = "",
        limit: int = 5,
    ) -> list[Hit]:
        """Hybrid search over ``namespaces`` (built from a principal by the caller)."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidInput("a search needs a non-empty query")
        query = query[:MAX_QUERY_CHARS]
        if not namespaces or limit <= 0:
            return []
        versions = list(
            zip(
                namespaces,
                await self.store.vector_versions(namespaces, collection=collection),
                strict=True,
            )
        )
        if not any(v for _, v in versions):
            return []  # nothing was ever written here: no query to embed, no search to run
        lexical = await self.store.lexical_search(
            namespaces, collection=collection, terms=query_terms(query), limit=CANDIDATES
        )
        vector = (await self.embedder.embed([query]))[0]
        near = await self.index.nearest(self.store, versions, collection, vector, CANDIDATES)
        in_lexical = set(lexical)
        by_vector = [seq for seq, cos in near if cos >= MIN_SIMILARITY or seq in in_lexical]
        fused = fuse([lexical, by_vector])[:limit]
        records = {
            r.seq: r for r in await self.store.memory_by_seq(namespaces, [s for s, _ in fused])
        }
        return [Hit(records[seq], score) for seq, score in fused if seq in records]

    async def search_for(
        self,
        principal: Principal,
        query: str,
        *,
        scopes: Sequence[str] = SCOPES,
        session_id: str | None = None,
        agent: str | None = None,
        limit: int = 5,
    ) -> list[Hit]:
        if session_id:
            await self.namespace(principal, "session", session_id=session_id)
        namespaces = self.readable(principal, scopes, session_id=session_id, agent=agent)
        return await self.search(namespaces, query, limit=limit)

    async def storage_used(self, principal: Principal) -> int:
        """Bytes of memory and knowledge ``principal`` keeps (what a storage quota counts)."""
        return await self.store.storage_used(principal.tenant, principal.user)

    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        """Everything of one user, gone: sessions, history, memory, knowledge, embeddings."""
        report = await self.store.forget_user(tenant, user)
        # Cached matrices of their namespaces would otherwise outlive the rows (until the next
        # version check); drop them now.
        self.index.forget(Namespace.user(tenant, user))
        return report

    # -- knowledge (KnowledgeService does the work; the namespaces are checked here) ----------
    async def add_document(
        self,
        principal: Principal,
        collection: str,
        data: bytes,
        *,
        name: str,
        media_type: str | None = None,
        scope: str = "user",
        session_id: str | None = None,
        agent: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        limits: IngestLimits | None = None,
        reserve: Reserve | None = None,
    ) -> Document:
        """Parse, chunk, embed and store one document (text, Markdown, HTML or PDF), within
        ``limits`` and the room ``reserve`` grants (:meth:`KnowledgeService.add_document`)."""
        collection = check_collection(collection)
        ns = await self.namespace(principal, scope, session_id=session_id, agent=agent, write=True)
        return await self._knowledge.add_document(
            ns,
            collection,
            data,
            name=name,
            media_type=media_type,
            author=principal.user,
            progress=progress,
            limits=limits,
            reserve=reserve,
        )

    async def list_documents(
        self,
        principal: Principal,
        *,
        collection: str | None = None,
        scope: str = "user",
        session_id: str | None = None,
        agent: str | None = None,
    ) -> list[Document]:
        ns = await self.namespace(principal, scope, session_id=session_id, agent=agent)
        return await self._knowledge.list_documents(ns, collection)

    async def delete_document(
        self,
        principal: Principal,
        collection: str,
        document_id: str,
        *,
        scope: str = "user",
        session_id: str | None = None,
        agent: str | None = None,
    ) -> None:
        ns = await self.namespace(principal, scope, session_id=session_id, agent=agent, write=True)
        await self._knowledge.delete_document(ns, check_collection(collection), document_id)

    async def search_knowledge(
        self,
        namespaces: Sequence[Namespace],
        query: str,
        collections: Sequence[str],
        *,
        limit: int = 5,
    ) -> list[Hit]:
        """Hybrid search of the named collections across ``namespaces``, fused into one list."""
        return await self._knowledge.search(namespaces, query, collections, limit=limit)
