"""What reading one document may cost: refused past its bounds, as early as can be, storing nothing.

The PDF bombs here are the attack's: pages that all draw one shared content stream, a few
kilobytes of file and millions of characters of text (``tests/memory/pdf_bomb.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence

import numpy as np
import pytest

from tests.memory.pdf_bomb import LINE, content_stream_bomb
from tether.errors import InvalidInput, StorageQuotaExceeded, TooLarge
from tether.memory.budget import Budget, IngestLimits
from tether.memory.documents import parse_and_chunk, parse_document
from tether.memory.embed import Vectors
from tether.memory.knowledge import KnowledgeService
from tether.records import Hit, Namespace

PAGE_CHARS = 220_000
"""Characters of text on each page of a bomb with the default 20,000 operations."""


def budget(**limits: float) -> Budget:
    return Budget("doc", IngestLimits(**limits))  # type: ignore[arg-type]


# -- PDFs ------------------------------------------------------------------------------------------
def test_the_bomb_is_what_the_attack_sent() -> None:
    data = content_stream_bomb(pages=40)
    assert len(data) < 12_000
    one_page = parse_document("bomb.pdf", content_stream_bomb(pages=1)).pages
    assert [len(p) for p in one_page] == [PAGE_CHARS]


def test_a_bomb_past_the_content_bound_is_refused_before_any_text_is_read() -> None:
    spend = budget()  # the defaults: 2,000,000 characters, so 32 MB of page content
    with pytest.raises(TooLarge, match="draw over 32,000,000 bytes of content"):
        parse_and_chunk("bomb.pdf", content_stream_bomb(pages=100), None, spend)
    assert spend.chars == 0  # not one page was extracted


def test_a_bomb_within_the_content_bound_stops_at_the_character_bound() -> None:
    # Three pages draw 1 MB (under the 1.6 MB this bound allows) and hold 660,000 characters.
    spend = budget(max_chars=100_000)
    with pytest.raises(TooLarge, match="text is over 100,000 characters"):
        parse_document("bomb.pdf", content_stream_bomb(pages=3), budget=spend)
    # Stopped inside the first page, by the text callback: no page was finished.
    assert spend.chars == 0


def test_pages_count_a_shared_stream_once_each() -> None:
    pages, ops = 10, 1_000
    content = pages * len(b"BT /F1 12 Tf 72 720 Td\n" + LINE * ops + b"ET\n")
    bound = (content - 1) // 16  # max_chars whose content bound is one byte short
    with pytest.raises(TooLarge, match="of content"):
        parse_document("b.pdf", content_stream_bomb(pages, ops), budget=budget(max_chars=bound))
    parsed = parse_document("b.pdf", content_stream_bomb(pages, ops), budget=budget())
    assert len(parsed.pages) == pages


def test_a_pdf_slower_than_the_time_bound_stops_mid_page() -> None:
    ticks = iter(range(10**9))
    spend = Budget("slow.pdf", IngestLimits(max_seconds=500), clock=lambda: float(next(ticks)))
    with pytest.raises(TooLarge, match="takes longer than 500 s"):
        parse_document("slow.pdf", content_stream_bomb(pages=2), budget=spend)
    assert spend.chars == 0  # the clock ran out inside the first page's operators


# -- other formats ---------------------------------------------------------------------------------
def test_text_past_the_character_bound() -> None:
    parse_document("ok.txt", b"x" * 1_000, budget=budget(max_chars=1_000))
    with pytest.raises(TooLarge, match="over 1,000 characters"):
        parse_document("big.txt", b"x" * 1_001, budget=budget(max_chars=1_000))


def test_html_stops_while_it_is_fed() -> None:
    page = ("<p>" + "word " * 20_000 + "</p>") * 100  # 10 MB of markup
    spend = budget(max_chars=50_000)
    with pytest.raises(TooLarge, match="over 50,000 characters"):
        parse_document("big.html", page.encode(), budget=spend)
    assert spend.chars == 0  # refused while parsing, before the whole page was read


def test_chunks_past_the_chunk_bound() -> None:
    headings = "".join(f"# {n}\nx\n" for n in range(200)).encode()  # a chunk per section
    assert len(parse_and_chunk("h.md", headings, None, budget(max_chunks=200))[1]) == 200
    with pytest.raises(TooLarge, match="over 199 chunks"):
        parse_and_chunk("h.md", headings, None, budget(max_chunks=199))


def test_text_with_a_nul_is_refused_whatever_its_declared_type() -> None:
    for media_type in (None, "text/plain", "text/html", "text/markdown"):
        with pytest.raises(InvalidInput, match="NUL"):
            parse_document("nul.txt", b"hello\x00world", media_type)


def test_no_budget_no_bound() -> None:
    parsed = parse_document("bomb.pdf", content_stream_bomb(pages=2))
    assert [len(p) for p in parsed.pages] == [PAGE_CHARS] * 2


# -- ingestion stores nothing it refused -----------------------------------------------------------
class _Records:
    """A RecallStore stand-in that records what would have been stored."""

    def __init__(self) -> None:
        self.documents: list[object] = []

    async def add_document(self, document: object, chunks: Sequence[object]) -> object:
        self.documents.append(document)
        return document

    async def list_documents(self, ns: Namespace, *, collection: str | None = None) -> list[object]:
        return []


async def _embed(texts: Sequence[str]) -> Vectors:
    return np.zeros((len(texts), 4), dtype=np.float32)


async def _search(*_: object, **__: object) -> list[Hit]:
    return []


@pytest.fixture
def knowledge() -> Iterator[tuple[KnowledgeService, _Records]]:
    records = _Records()
    yield KnowledgeService(records, _embed, _search), records  # type: ignore[arg-type]


NS = Namespace.user("acme", "alice")


async def test_a_refused_document_stores_nothing(
    knowledge: tuple[KnowledgeService, _Records],
) -> None:
    service, records = knowledge
    with pytest.raises(TooLarge):
        await service.add_document(
            NS, "kb", content_stream_bomb(pages=100), name="bomb.pdf", media_type=None, author="a"
        )
    with pytest.raises(TooLarge):
        await service.add_document(
            NS,
            "kb",
            b"x" * 5_000,
            name="long.txt",
            media_type=None,
            author="a",
            limits=IngestLimits(max_chars=4_999),
        )
    assert records.documents == []


async def test_the_reserve_sees_the_records_size_and_may_refuse(
    knowledge: tuple[KnowledgeService, _Records],
) -> None:
    service, records = knowledge
    asked: list[int] = []

    @contextlib.asynccontextmanager
    async def refuse(size: int) -> AsyncIterator[None]:
        asked.append(size)
        if size:
            raise StorageQuotaExceeded("no room")
        yield

    with pytest.raises(StorageQuotaExceeded):
        await service.add_document(
            NS,
            "kb",
            "héllo wörld".encode(),
            name="a.txt",
            media_type=None,
            author="a",
            reserve=refuse,
        )
    assert asked == [len("héllo wörld".encode()) + 4 * 4]  # the text and a 4-float embedding
    assert records.documents == []
