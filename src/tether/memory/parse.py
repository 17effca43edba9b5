"""Document parsing: bytes of text, Markdown, HTML or PDF to the text of each page.

Everything here is synchronous and CPU-bound (PDF text extraction especially): async callers run it
in a worker thread. Malformed input of any kind raises :class:`~tether.errors.InvalidInput`, never
a parser's own exception; input over :data:`MAX_DOCUMENT_BYTES`, or whose text is over its
:class:`~tether.memory.budget.Budget` (characters, seconds), raises
:class:`~tether.errors.TooLarge` as soon as that is known: a PDF stops at the page, indeed the
text operation, where it went over.

HTML headings come out of :func:`parse_document` as Markdown ``#`` lines, so that one heading rule
serves both formats when chunking (:mod:`tether.memory.chunks`).
"""

from __future__ import annotations

import codecs
import logging
import os
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING

from tether.errors import InvalidInput, TooLarge
from tether.memory.budget import UNBOUNDED, Budget

if TYPE_CHECKING:
    from pypdf import PageObject

log = logging.getLogger(__name__)

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


def load_path(path: str | os.PathLike[str], *, budget: Budget | None = None) -> ParsedDocument:
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
    return parse_document(file.name, data, budget=budget)


def parse_document(
    name: str, data: bytes, media_type: str | None = None, *, budget: Budget | None = None
) -> ParsedDocument:
    """Extract the text of a document; ``media_type`` may carry a ``charset`` (default UTF-8).

    Raises :class:`TooLarge` over :data:`MAX_DOCUMENT_BYTES` or over ``budget`` (if given), and
    :class:`InvalidInput` for text that does not decode or holds a NUL, a broken or encrypted
    PDF, or a PDF with no extractable text.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise TooLarge(f"{name}: document is over {MAX_DOCUMENT_BYTES} bytes")
    budget = budget or Budget(name, UNBOUNDED)
    kind = detect_media_type(name, data, media_type)
    if kind == PDF:
        return ParsedDocument(name, kind, _pdf_pages(name, data, budget))
    text = _decode(name, data, _split_content_type(media_type or "")[1])
    if "\x00" in text:
        # Refused whatever the declared type: no store may be handed a NUL (PostgreSQL text
        # cannot hold one), and text with one is more likely binary than prose.
        raise InvalidInput(f"{name}: the text holds a NUL character")
    if kind == HTML:
        text = _html_text(text, budget)
    budget.add_chars(len(text))
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


def _pdf_pages(name: str, data: bytes, budget: Budget) -> list[str]:
    # Imported here: pypdf is only needed for PDFs.
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError

    try:
        reader = PdfReader(BytesIO(data))
        # PdfReader already tried the empty user password; this tells whether that worked.
        if reader.is_encrypted and not reader.decrypt(""):
            raise InvalidInput(f"{name}: the PDF is encrypted with a password")
        # What the pages draw, counted before any of it is parsed: pages sharing one stream
        # (a few kilobytes of file, millions of characters of text) are refused here.
        content = 0
        for page in reader.pages:
            content += _content_size(page)
            budget.check_pdf_content(content)
            budget.check_time()
        pages = [_page_text(page, budget) for page in reader.pages]
    except (InvalidInput, TooLarge):
        raise
    except LimitReachedError as exc:  # pypdf's own bounds: a stream decoding to over 75 MB…
        raise TooLarge(f"{name}: the PDF expands past what can be read") from exc
    # A damaged file can fail anywhere inside pypdf, with any exception type (KeyError,
    # RecursionError, zlib.error…): all of them mean "this is not a PDF we can read".
    except Exception as exc:
        # pypdf's words describe its internals, not the caller's file: they stay in the log.
        log.info("%s: pypdf cannot read it: %s: %s", name, type(exc).__name__, exc)
        raise InvalidInput(f"{name}: not a readable PDF") from exc
    if not any(page.strip() for page in pages):
        raise InvalidInput(f"{name}: the PDF has no extractable text (scanned images?)")
    return pages


def _content_size(page: PageObject) -> int:
    """Bytes of content a page draws, decoded (pypdf keeps a decoded stream: a stream shared
    by many pages is decoded once)."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    streams = contents if isinstance(contents, list) else [contents]
    return sum(len(stream.get_object().get_data()) for stream in streams)


def _page_text(page: PageObject, budget: Budget) -> str:
    """A page's text, spending from ``budget`` as pypdf goes: it calls back for every operator
    and every piece of text, so one page cannot run past the bounds either."""
    seen = 0

    def on_text(text: str, *_: object) -> None:
        nonlocal seen
        seen += len(text)
        budget.check_chars(seen)

    def on_operator(*_: object) -> None:
        budget.check_time()

    text = page.extract_text(visitor_text=on_text, visitor_operand_before=on_operator) or ""
    budget.add_chars(len(text))
    return text


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
        self.chars = 0
        """Characters of text so far (what the budget is checked against as the page is fed)."""
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
            self.chars += len(self.parts[-1])

    def _break(self, tag: str, *, start: bool) -> None:
        if tag in _BLOCK_TAGS:
            self._in_heading = False  # an unclosed heading ends at the next block
            self.parts.append("\n\n")
        elif start and tag in _LINE_TAGS:  # items start lines; their ends need no second break
            self.parts.append(" " if self._in_heading else "\n")
        elif start and tag in ("td", "th"):
            self.parts.append(" ")


_FEED = 65_536
"""Characters of markup parsed between two checks of the budget."""


def _html_text(markup: str, budget: Budget) -> str:
    parser = _TextExtractor()
    for start in range(0, len(markup), _FEED):
        parser.feed(markup[start : start + _FEED])
        budget.check_chars(parser.chars)
        budget.check_time()
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
