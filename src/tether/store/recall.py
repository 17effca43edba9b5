"""The memory and knowledge half of the store protocol (DESIGN §8).

Records (memory items and knowledge chunks) live in namespaces (:class:`Namespace`); every call
names the namespaces it may touch, built by the caller from the principal, and the store never
returns or changes a record outside them. Search is split: the store does the lexical half
(SQLite FTS5, PostgreSQL ``tsvector``) and hands out embeddings per namespace with a version, so
the vector half runs in memory (numpy) over a matrix cached until the version moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tether.memory.records import (
    Document,
    ForgetReport,
    MemoryRecord,
    Namespace,
    VectorSnapshot,
)


class RecallStore(Protocol):
    # -- records ---------------------------------------------------------------------------------
    async def put_memory(self, record: MemoryRecord, embedding: bytes) -> MemoryRecord:
        """Insert a new record (its ``id`` must be new); returns it with ``seq`` assigned."""
        ...

    async def update_memory(
        self,
        ns: Namespace,
        record_id: str,
        *,
        content: str,
        kind: str,
        embedding: bytes,
        expected_revision: int,
        now: float,
    ) -> MemoryRecord:
        """Compare-and-set: replace content, kind and embedding when the revision is still
        ``expected_revision``; the revision then grows by one.

        Raises :class:`MemoryNotFound` when there is no such record in ``ns`` and
        :class:`RevisionConflict` (with the current revision) when it moved.
        """
        ...

    async def get_memory(self, ns: Namespace, record_id: str) -> MemoryRecord | None: ...

    async def find_memory(
        self, namespaces: Sequence[Namespace], record_id: str
    ) -> MemoryRecord | None:
        """The record with this id in any of ``namespaces`` (callers rarely know its scope)."""
        ...

    async def locate_memory(self, record_id: str) -> Namespace | None:
        """The namespace a record lives in (nothing of its content): callers check the principal
        may read that namespace before they fetch the record from it."""
        ...

    async def list_memory(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str = "",
        after_seq: int = 0,
        limit: int = 50,
    ) -> list[MemoryRecord]:
        """Records of ``collection`` (``""``: memory items) in ``namespaces``, oldest first."""
        ...

    async def memory_by_seq(
        self, namespaces: Sequence[Namespace], seqs: Sequence[int]
    ) -> list[MemoryRecord]:
        """The records with these ``seq`` that lie in ``namespaces`` (others are left out)."""
        ...

    async def delete_memory(self, ns: Namespace, record_id: str) -> bool: ...

    async def clear_memory(self, ns: Namespace, *, collection: str | None = "") -> int:
        """Delete ``ns``'s records of ``collection``; ``None``: every record and document."""
        ...

    async def delete_turn_memory(
        self, namespaces: Sequence[Namespace], turn_id: str, author: str
    ) -> int:
        """Delete records written by ``author`` during ``turn_id`` (a rolled-back turn's notes)."""
        ...

    # -- search ----------------------------------------------------------------------------------
    async def lexical_search(
        self,
        namespaces: Sequence[Namespace],
        *,
        collection: str,
        terms: Sequence[str],
        limit: int,
    ) -> list[int]:
        """``seq`` of the best lexical matches of any of ``terms`` (words: letters and digits
        only), best first."""
        ...

    async def vector_version(self, ns: Namespace, *, collection: str) -> int:
        """A number that changes whenever a record of ``ns``/``collection`` is added, changed or
        deleted (cheap: it is read before every vector search)."""
        ...

    async def vector_versions(
        self, namespaces: Sequence[Namespace], *, collection: str
    ) -> list[int]:
        """:meth:`vector_version` of each namespace, in order, in one round trip (a turn reads
        those of every scope it recalls from)."""
        ...

    async def load_vectors(self, ns: Namespace, *, collection: str) -> VectorSnapshot: ...

    # -- knowledge documents ---------------------------------------------------------------------
    async def add_document(
        self, document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
    ) -> Document:
        """Store a document and its chunks in one transaction."""
        ...

    async def list_documents(
        self, ns: Namespace, *, collection: str | None = None
    ) -> list[Document]: ...

    async def delete_document(self, ns: Namespace, collection: str, document_id: str) -> bool:
        """Delete a document and its chunks."""
        ...

    # -- forget ----------------------------------------------------------------------------------
    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        """Delete everything of one user: sessions (items, turns, events, summaries), session
        and user memory, user-scope knowledge and its documents. Shared (agent, tenant) records
        stay. One transaction."""
        ...
