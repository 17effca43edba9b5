"""Knowledge documents: bytes in, chunks ready to index out (DESIGN §8).

::

    load_path / bytes ──detect_media_type──▶ parse_document ──▶ ParsedDocument ──▶ chunk_document
                                              text · markdown · html · pdf           list[Chunk]

Everything here is synchronous and CPU-bound (PDF text extraction especially): async callers run it
in a worker thread. Malformed input of any kind raises :class:`~tether.errors.InvalidInput`, never
a parser's own exception; input over :data:`MAX_DOCUMENT_BYTES` raises
:class:`~tether.errors.TooLarge`.

HTML headings come out of :func:`parse_document` as Markdown ``#`` lines, so that one heading rule
serves both formats when chunking.
"""

from __future__ import annotations

import codecs
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from io import BytesIO
from pathlib import Path

from tether.errors import ConfigError, InvalidInput, TooLarge

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "Chunk",
    "ParsedDocument",
    "chunk_document",
    "detect_media_type",
    "load_path",
    "parse_document",
]

MAX_DOCUMENT_BYTES = 20 * 1024 * 1024
"""The largest document :func:`parse_document` accepts, in bytes."""

TEXT, MARKDOWN, HTML, PDF = "text/plain", "text/markdown", "text/html", "application/pdf"
_ALIASES = {
    TEXT: TEXT,
    MARKDOWN: MARKDOWN,
    "text/x-markdown": MARKDOWN,
    HTML: HTML,
    "application/xhtml+xml": HTML,
    PDF: PDF,
    "application/x-pdf": PDF,
}
_EXTENSIONS = {
    ".txt": TEXT,
    ".text": TEXT,
    ".md": MARKDOWN,
    ".markdown": MARKDOWN,
    ".html": HTML,
    ".htm": HTML,
    ".pdf": PDF,
}
# Declared types that say nothing about the content (curl and browsers send them for any file).
_UNINFORMATIVE = {"", "application/octet-stream", "binary/octet-stream"}


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """A document's text, before chunking."""

    name: str
    """Where it came from: a file name, or ``"text"`` for raw text."""
    media_type: str
    """One of ``text/plain``, ``text/markdown``, ``text/html``, ``application/pdf``."""
    pages: list[str]
    """The text of each page: one entry for anything but a PDF."""


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


# ── media types ──────────────────────────────────────────────────────────────────────────────────


def _split_content_type(value: str) -> tuple[str, str | None]:
    kind, _, params = value.partition(";")
    charset = None
    for param in params.split(";"):
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip():
            charset = val.strip().strip("\"'")
    return kind.strip().lower(), charset


def detect_media_type(name: str, data: bytes, declared: str | None = None) -> str:
    """The media type of a document: the declared content type (parameters ignored) when it says
    something, else the file extension, else a sniff of the bytes; UTF-8 text is ``text/plain``.

    Raises :class:`InvalidInput` for a type this module cannot read, or for binary data.
    """
    kind, _ = _split_content_type(declared or "")
    if kind not in _UNINFORMATIVE:
        if kind in _ALIASES:
            return _ALIASES[kind]
        if kind.startswith("text/"):  # csv, x-rst, x-python…: readable as plain text
            return TEXT
        raise InvalidInput(f"{name}: unsupported media type {kind!r}")
    extension = os.path.splitext(name)[1].lower()
    if extension in _EXTENSIONS:
        return _EXTENSIONS[extension]
    if b"%PDF-" in data[:1024]:  # the header may follow some junk; readers allow 1 KiB of it
        return PDF
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if head.startswith((b"<!doctype html", b"<html")):
        return HTML
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return TEXT
    if b"\x00" not in data:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:
            return TEXT
    raise InvalidInput(
        f"{name}: unsupported or binary content (expected text, Markdown, HTML, PDF)"
    )


# ── parsing ──────────────────────────────────────────────────────────────────────────────────────


def load_path(path: str | os.PathLike[str]) -> ParsedDocument:
    """Read and parse a file; the document's name is the file name.

    An unreadable file raises :class:`InvalidInput`, a file over :data:`MAX_DOCUMENT_BYTES`
    :class:`TooLarge` (without reading more of it than that).
    """
    file = Path(path)
    try:
        with file.open("rb") as fh:
            data = fh.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {file}: {exc.strerror or exc}") from exc
    return parse_document(file.name, data)


def parse_document(name: str, data: bytes, media_type: str | None = None) -> ParsedDocument:
    """Extract the text of a document; ``media_type`` may carry a ``charset`` (default UTF-8).

    Raises :class:`TooLarge` over :data:`MAX_DOCUMENT_BYTES`, and :class:`InvalidInput` for text
    that does not decode, a broken or encrypted PDF, or a PDF with no extractable text.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise TooLarge(f"{name}: document is over {MAX_DOCUMENT_BYTES} bytes")
    kind = detect_media_type(name, data, media_type)
    if kind == PDF:
        return ParsedDocument(name, kind, _pdf_pages(name, data))
    text = _decode(name, data, _split_content_type(media_type or "")[1])
    if kind == HTML:
        text = _html_text(text)
    return ParsedDocument(name, kind, [text])


def _decode(name: str, data: bytes, charset: str | None) -> str:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        charset = "utf-16"
    encoding = charset or "utf-8-sig"
    if encoding.lower().replace("_", "-") in ("utf-8", "utf8"):
        encoding = "utf-8-sig"  # accept a BOM whatever the declaration says
    try:
        text = data.decode(encoding)
    except LookupError as exc:
        raise InvalidInput(f"{name}: unknown charset {charset!r}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidInput(
            f"{name}: not valid {charset or 'UTF-8'} text "
            f"(byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from exc
    return text.replace("\r\n", "\n")


def _pdf_pages(name: str, data: bytes) -> list[str]:
    from pypdf import PdfReader  # imported here: pypdf is only needed for PDFs

    try:
        reader = PdfReader(BytesIO(data))
        # PdfReader already tried the empty user password; this tells whether that worked.
        if reader.is_encrypted and not reader.decrypt(""):
            raise InvalidInput(f"{name}: the PDF is encrypted with a password")
        pages = [page.extract_text() or "" for page in reader.pages]
    except InvalidInput:
        raise
    # A damaged file can fail anywhere inside pypdf, with any exception type (KeyError,
    # RecursionError, zlib.error…): all of them mean "this is not a PDF we can read".
    except Exception as exc:
        detail = str(exc) or type(exc).__name__
        raise InvalidInput(f"{name}: not a readable PDF ({detail})") from exc
    if not any(page.strip() for page in pages):
        raise InvalidInput(f"{name}: the PDF has no extractable text (scanned images?)")
    return pages


_SKIPPED = frozenset({"script", "style", "noscript", "template", "title", "head"})
_HEAD_CONTENT = frozenset(
    {"title", "meta", "link", "style", "script", "base", "noscript", "template"}
)
_LINE_TAGS = frozenset({"br", "li", "tr", "dt", "dd", "option"})
_BLOCK_TAGS = frozenset(
    {
        *("address", "article", "aside", "blockquote", "body", "caption", "details", "dialog"),
        *("div", "dl", "fieldset", "figcaption", "figure", "footer", "form", "header", "hr"),
        *("html", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "tbody"),
        *("tfoot", "thead", "ul"),
    }
)
_HEADINGS = {f"h{level}": level for level in range(1, 7)}
_HEADING_MARK = "\x00"  # starts our heading lines; handle_data drops any NUL of the page's own
# Page text the chunker would read as Markdown structure: a heading, an underline, a fence.
_LOOKS_LIKE_MARKDOWN = re.compile(r"#|[=-]+$|```|~~~")


class _TextExtractor(HTMLParser):
    """Visible text of an HTML page; headings become Markdown ``#`` lines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)  # entities arrive decoded in handle_data
        self.parts: list[str] = []
        self._skip: list[str] = []
        self._pre = 0
        self._in_heading = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip == ["head"] and tag not in _HEAD_CONTENT:
            self._skip.clear()  # the body started without a </head>
        if tag in _SKIPPED:
            self._skip.append(tag)
        elif self._skip:
            return
        elif tag in _HEADINGS:
            self.parts.append(f"\n\n{_HEADING_MARK}{'#' * _HEADINGS[tag]} ")
            self._in_heading = True
        else:
            self._pre += tag == "pre"
            self._break(tag, start=True)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _SKIPPED:  # <br/> is one break, not two
            self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            if tag in self._skip:
                del self._skip[self._skip.index(tag) :]
        elif tag in _HEADINGS:
            self._in_heading = False
            self.parts.append("\n\n")
        else:
            self._pre = max(0, self._pre - (tag == "pre"))
            self._break(tag, start=False)

    def handle_data(self, data: str) -> None:
        if not self._skip:
            data = data.replace(_HEADING_MARK, "")
            keep_lines = self._pre and not self._in_heading
            self.parts.append(data if keep_lines else re.sub(r"\s+", " ", data))

    def _break(self, tag: str, *, start: bool) -> None:
        if tag in _BLOCK_TAGS:
            self._in_heading = False  # an unclosed heading ends at the next block
            self.parts.append("\n\n")
        elif start and tag in _LINE_TAGS:  # items start lines; their ends need no second break
            self.parts.append(" " if self._in_heading else "\n")
        elif start and tag in ("td", "th"):
            self.parts.append(" ")


def _html_text(markup: str) -> str:
    parser = _TextExtractor()
    parser.feed(markup)
    parser.close()
    lines = []
    for raw in "".join(parser.parts).split("\n"):
        line = " ".join(raw.split())
        if line.startswith(_HEADING_MARK):
            line = line[1:]
            if not line.strip("# "):
                continue  # an empty <hN>
        elif _LOOKS_LIKE_MARKDOWN.match(line):
            line = "    " + line  # indented: the chunker reads it as text, not as structure
        lines.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


# ── chunking ─────────────────────────────────────────────────────────────────────────────────────

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


def chunk_document(doc: ParsedDocument, *, size: int = 800, overlap: int = 120) -> list[Chunk]:
    """Split a document into chunks of at most ``size`` characters.

    Splits fall on paragraph breaks, else sentence ends, else line breaks, else spaces; a word is
    cut only when it alone is longer than ``size``. Each chunk but the first of a section starts
    with up to ``overlap`` characters of the previous chunk's tail, cut at a word start. Chunks
    never span a PDF page nor a heading: each page, and each Markdown/HTML section, is chunked on
    its own. Deterministic.
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
