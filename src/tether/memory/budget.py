"""What reading one document may cost: characters, chunks, seconds, bytes (DESIGN §8).

A document's size on disk says little about what it expands to: a PDF whose pages all draw one
shared, compressed content stream is a few kilobytes and millions of characters. So ingestion
spends from a :class:`Budget` as it goes (parsing page by page, chunking chunk by chunk,
embedding batch by batch) and stops with :class:`~tether.errors.TooLarge` the moment a bound is
passed, before anything is stored.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from tether.errors import ConfigError, TooLarge

PDF_CONTENT_BYTES_PER_CHAR = 16
"""How many bytes of page content a PDF may draw per character of :attr:`IngestLimits.max_chars`.

Text takes at least a byte of content per character, with operators around it; beyond this the
content is mostly drawing, which gives no text and still costs parsing (pypdf reads about half a
megabyte of content a second). Pages drawing a shared stream count it once per page.
"""


@dataclass(frozen=True, slots=True)
class IngestLimits:
    """Bounds of one document's ingestion (server settings: ``TETHER_MAX_DOCUMENT_*``)."""

    max_chars: int = 2_000_000
    """Characters of text, all pages together (about 1,000 pages of prose)."""
    max_chunks: int = 5_000
    """Chunks the text may be split into."""
    max_seconds: float = 60.0
    """Wall time to parse, chunk and embed it."""

    def __post_init__(self) -> None:
        if self.max_chars < 1 or self.max_chunks < 1 or not self.max_seconds > 0:
            raise ConfigError(f"ingestion limits must be positive, got {self}")

    @property
    def max_pdf_content_bytes(self) -> int:
        return self.max_chars * PDF_CONTENT_BYTES_PER_CHAR


UNBOUNDED = IngestLimits(max_chars=sys.maxsize, max_chunks=sys.maxsize, max_seconds=math.inf)
"""No bound but the parser's own (:data:`~tether.memory.parse.MAX_DOCUMENT_BYTES`): what
parsing and chunking do when no budget is given. Knowledge ingestion always has one."""


class Budget:
    """One document's ingestion against its :class:`IngestLimits`.

    Not thread-safe, and need not be: one ingestion spends from it, one step after the other
    (parsing and chunking in a worker thread, then embedding on the event loop).
    """

    def __init__(
        self,
        name: str,
        limits: IngestLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.limits = limits or IngestLimits()
        self.chars = 0
        self.chunks = 0
        self._clock = clock
        self._deadline = clock() + self.limits.max_seconds

    def check_time(self) -> None:
        if self._clock() > self._deadline:
            raise TooLarge(
                f"{self.name}: reading it takes longer than {self.limits.max_seconds:g} s"
            )

    def check_chars(self, more: int = 0) -> None:
        """Refuse once the document's text (``more`` not yet counted) is over the bound."""
        if self.chars + more > self.limits.max_chars:
            raise TooLarge(f"{self.name}: its text is over {self.limits.max_chars:,} characters")

    def add_chars(self, count: int) -> None:
        self.chars += count
        self.check_chars()

    def add_chunk(self) -> None:
        self.chunks += 1
        if self.chunks > self.limits.max_chunks:
            raise TooLarge(f"{self.name}: it makes over {self.limits.max_chunks:,} chunks")
        self.check_time()

    def check_pdf_content(self, size: int) -> None:
        """Refuse a PDF whose pages draw more than :attr:`IngestLimits.max_pdf_content_bytes`."""
        if size > self.limits.max_pdf_content_bytes:
            raise TooLarge(
                f"{self.name}: its pages draw over {self.limits.max_pdf_content_bytes:,} bytes"
                " of content"
            )
