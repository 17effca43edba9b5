"""Chunking: a parsed document's pages to pieces small enough to embed and to place in a prompt.

Synchronous, CPU-bound and deterministic, like parsing: async callers run both in a worker thread
(:func:`tether.memory.documents.parse_and_chunk`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from tether.errors import ConfigError
from tether.memory.budget import Budget
from tether.memory.parse import HTML, MARKDOWN, PDF, ParsedDocument


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a document, small enough to embed and to place in a prompt."""

    text: str
    """Whitespace-normalised text; starts with the tail of the previous chunk (the overlap)."""
    index: int
    """0-based position within the document."""
    page: int | None
    """1-based page of a PDF (a chunk never spans pages); ``None`` for other formats."""
    heading: str | None
    """The nearest Markdown or HTML heading above the chunk, if there is one."""


_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r" {0,3}(?:=+|-+)[ \t]*$")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_LINE_BREAKS = str.maketrans(dict.fromkeys("\r\f\v\x85\u2028\u2029", "\n"))
_INVISIBLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f\u00ad\ufeff]")  # controls, soft hyphen, BOM
_SPACES = re.compile(r"[^\S\n]+")
_BLANK_LINES = re.compile(r"\n(?:[ ]*\n)+")
# Candidate split points, coarsest first: sentence ends, line breaks, spaces. Lookbehinds keep the
# terminator (and a closing quote or bracket) with its sentence.
_SPLITTERS = (
    re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"'”’»)\]]))[ \n]+|(?<=[。！？])[ \n]*"),
    re.compile(r"\n"),
    re.compile(r"[ \n]+"),
)
# Where an overlap may start: just after a space, or after CJK punctuation.
_WORD_START = re.compile(r"(?:\s|[。！？；，、])(?=\S)")


def chunk_document(
    doc: ParsedDocument, *, size: int = 800, overlap: int = 120, budget: Budget | None = None
) -> list[Chunk]:
    """Split a document into chunks of at most ``size`` characters.

    Splits fall on paragraph breaks, else sentence ends, else line breaks, else spaces; a word is
    cut only when it alone is longer than ``size``. Each chunk but the first of a section starts
    with up to ``overlap`` characters of the previous chunk's tail, cut at a word start. Chunks
    never span a PDF page nor a heading: each page, and each Markdown/HTML section, is chunked on
    its own. Deterministic. With a ``budget``, each chunk is counted against it, and the
    document refused (:class:`~tether.errors.TooLarge`) at the first chunk over it.
    """
    if size < 1 or not 0 <= overlap < size:
        raise ConfigError(f"need size >= 1 and 0 <= overlap < size, got {size=} {overlap=}")
    headed = doc.media_type in (MARKDOWN, HTML)
    paged = doc.media_type == PDF
    chunks: list[Chunk] = []
    heading: str | None = None
    for number, page in enumerate(doc.pages, start=1):
        for section_heading, body in _sections(page.replace("\r\n", "\n"), heading, headed):
            heading = section_heading  # a page's last heading carries on to the next page
            pieces: list[tuple[str, str]] = []
            for paragraph in _paragraphs(body):
                _split(paragraph, "\n\n", 0, size - overlap, size, pieces)
            for text in _pack(pieces, size, overlap):
                if budget is not None:
                    budget.add_chunk()
                chunks.append(Chunk(text, len(chunks), number if paged else None, heading))
    return chunks


def _sections(text: str, heading: str | None, headed: bool) -> Iterator[tuple[str | None, str]]:
    """``(heading, text)`` of each section; a heading with nothing under it (``# A`` right above
    ``## B``) joins the next section rather than becoming a chunk of its own."""
    if not headed:
        yield heading, text
        return
    lines: list[str] = []
    body = 0  # non-blank lines of the current section that are not its headings
    fence = "---" if text.startswith("---\n") else ""  # YAML front matter, closed by --- or ...
    for number, line in enumerate(text.split("\n")):
        title: str | None = None
        taken: list[str] = []
        fenced = _FENCE.match(line)
        if fence == "---":
            if number and line.rstrip() in ("---", "..."):
                fence = ""
        elif fence:
            if fenced and fenced[1][0] == fence[0] and len(fenced[1]) >= len(fence):
                fence = ""
        elif fenced:
            fence = fenced[1]
        elif atx := _ATX.match(line):
            title = atx[2] or ""
        elif (
            _SETEXT.match(line)
            and body
            and lines[-1].strip()
            and (body == 1 or not lines[-2].strip())
        ):
            # Underlined text is a heading when it is a paragraph of one line.
            taken = [lines.pop()]
            title, body = taken[0], body - 1
        if title is None:
            lines.append(line)
            body += bool(line.strip())
            continue
        if body:
            yield heading, "\n".join(lines)
            lines, body = [], 0
        lines += [*taken, line]
        heading = " ".join(title.split()) or None
    if lines:
        yield heading, "\n".join(lines)


def _paragraphs(text: str) -> list[str]:
    text = _INVISIBLE.sub("", text.translate(_LINE_BREAKS))
    text = _SPACES.sub(" ", text)
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        paragraph = "\n".join(line for line in (part.strip() for part in block.split("\n")) if line)
        if paragraph:
            paragraphs.append(paragraph)
    return paragraphs


def _split(
    text: str, sep: str, level: int, target: int, size: int, out: list[tuple[str, str]]
) -> None:
    """Append ``(separator before, piece)`` pairs to ``out``: pieces at most ``target`` long where
    a split point allows it, words up to ``size`` whole, longer words cut into ``size`` slices."""
    if level == len(_SPLITTERS):
        out.append((sep, text[:size]))
        out.extend(("", text[start : start + size]) for start in range(size, len(text), size))
        return
    if len(text) <= target:
        out.append((sep, text))
        return
    start = 0
    for match in _SPLITTERS[level].finditer(text):
        if match.start() > start:
            _split(text[start : match.start()], sep, level + 1, target, size, out)
            sep = match.group()
        start = max(start, match.end())
    if start < len(text):
        _split(text[start:], sep, level + 1, target, size, out)


def _pack(pieces: list[tuple[str, str]], size: int, overlap: int) -> Iterator[str]:
    """Greedily join pieces into chunks of at most ``size``, each after the first starting with the
    previous chunk's tail."""
    current: list[str] = []
    length = 0
    for sep, piece in pieces:
        if not current:
            current, length = [piece], len(piece)
        elif length + len(sep) + len(piece) <= size:
            current += [sep, piece]
            length += len(sep) + len(piece)
        else:
            previous = "".join(current)
            yield previous
            tail = _tail(previous, min(overlap, size - len(sep) - len(piece)))
            current = [tail, sep, piece] if tail else [piece]
            length = sum(map(len, current))
    if current:
        yield "".join(current)


def _tail(text: str, limit: int) -> str:
    """The longest end of ``text`` of at most ``limit`` characters that starts at a word start."""
    if limit <= 0:
        return ""
    match = _WORD_START.search(text, max(len(text) - limit - 1, 0))
    return text[match.end() :] if match else ""
