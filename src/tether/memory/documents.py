"""Knowledge documents: bytes in, chunks ready to index out (DESIGN §8).

::

    load_path / bytes ──detect_media_type──▶ parse_document ──▶ ParsedDocument ──▶ chunk_document
                                              text · markdown · html · pdf           list[Chunk]

The two steps live in :mod:`tether.memory.parse` and :mod:`tether.memory.chunks`; this module is
where callers take them from, so that either can change inside without moving an import. Both are
synchronous and CPU-bound: async callers run :func:`parse_and_chunk` in a worker thread. Malformed
input of any kind raises :class:`~tether.errors.InvalidInput`, input over
:data:`MAX_DOCUMENT_BYTES`, or whose text is over the ingestion's
:class:`~tether.memory.budget.Budget`, :class:`~tether.errors.TooLarge`.
"""

from __future__ import annotations

from tether.memory.budget import UNBOUNDED, Budget, IngestLimits
from tether.memory.chunks import Chunk, chunk_document
from tether.memory.parse import (
    MAX_DOCUMENT_BYTES,
    ParsedDocument,
    detect_media_type,
    load_path,
    parse_document,
)

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "Budget",
    "Chunk",
    "IngestLimits",
    "ParsedDocument",
    "chunk_document",
    "detect_media_type",
    "load_path",
    "parse_and_chunk",
    "parse_document",
]


def parse_and_chunk(
    name: str, data: bytes, media_type: str | None, budget: Budget | None = None
) -> tuple[ParsedDocument, list[Chunk]]:
    """Parse a document and chunk it: both steps in one call, for one worker thread, within one
    ``budget`` (default: none, :data:`~tether.memory.budget.UNBOUNDED`)."""
    budget = budget or Budget(name, UNBOUNDED)
    parsed = parse_document(name, data, media_type, budget=budget)
    return parsed, chunk_document(parsed, budget=budget)
