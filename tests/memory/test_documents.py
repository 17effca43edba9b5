"""Documents to chunks: detection, parsing of each format, chunk boundaries, and typed errors."""

from __future__ import annotations

import itertools
import random
import re
import time
from pathlib import Path

import pytest
from fpdf import FPDF

from tether.errors import ConfigError, InvalidInput, TooLarge
from tether.memory.documents import (
    MAX_DOCUMENT_BYTES,
    Chunk,
    ParsedDocument,
    chunk_document,
    detect_media_type,
    load_path,
    parse_document,
)


def text_doc(text: str, media_type: str = "text/plain") -> ParsedDocument:
    return ParsedDocument("text", media_type, [text])


def make_pdf(pages: list[str], *, user_password: str | None = None) -> bytes:
    pdf = FPDF()
    if user_password is not None:
        pdf.set_encryption(owner_password="owner", user_password=user_password)
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        if text:
            pdf.multi_cell(0, 5, text)
    return bytes(pdf.output())


def prose(rng: random.Random, paragraphs: int, prefix: str = "w") -> str:
    """Paragraphs of sentences whose words are all distinct (``w17``), so positions are known."""
    counter = 0
    out = []
    for _ in range(paragraphs):
        sentences = []
        for _ in range(rng.randint(1, 9)):
            words = [f"{prefix}{counter + i}" for i in range(rng.randint(3, 14))]
            counter += len(words)
            sentences.append(" ".join(words) + rng.choice(".!?"))
        out.append(" ".join(sentences))
    return "\n\n".join(out)


def word_spans(chunks: list[Chunk], source: str) -> list[range]:
    """Where each chunk's words sit in the source; fails unless they are a contiguous run."""
    words = source.split()
    position = {word: i for i, word in enumerate(words)}
    assert len(position) == len(words), "the source must not repeat a word"
    spans = []
    for chunk in chunks:
        got = chunk.text.split()
        start = position[got[0]]
        assert got == words[start : start + len(got)], f"chunk {chunk.index} is not a run of words"
        spans.append(range(start, start + len(got)))
    return spans


# ── chunk boundaries ─────────────────────────────────────────────────────────────────────────────


def test_overlap_between_consecutive_chunks_and_no_text_lost() -> None:
    source = prose(random.Random(7), 40)
    size, overlap = 300, 60
    chunks = chunk_document(text_doc(source), size=size, overlap=overlap)
    assert len(chunks) > 10
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(0 < len(c.text) <= size for c in chunks)

    spans = word_spans(chunks, source)
    covered = set().union(*spans)
    assert covered == set(range(len(source.split()))), "some source words are in no chunk"
    overlaps = 0
    for prev, nxt, prev_span, next_span in zip(chunks, chunks[1:], spans, spans[1:], strict=False):
        assert next_span.start <= prev_span.stop, "a gap between chunks"
        assert next_span.start > prev_span.start, "no progress"
        shared = prev_span.stop - next_span.start
        if shared:
            overlaps += 1
            end = list(re.finditer(r"\S+", nxt.text))[shared - 1].end()
            repeated = nxt.text[:end]
            assert prev.text.endswith(repeated), "the overlap is not the previous chunk's tail"
            assert overlap // 2 <= len(repeated) <= overlap
    assert overlaps == len(chunks) - 1, "every boundary inside one text carries an overlap"


def test_without_overlap_chunks_partition_the_text() -> None:
    source = prose(random.Random(3), 25)
    chunks = chunk_document(text_doc(source), size=250, overlap=0)
    joined = [word for c in chunks for word in c.text.split()]
    assert joined == source.split()


def test_splits_prefer_sentence_ends_then_words() -> None:
    sentences = [f"Sentence number {i} has a handful of plain words in it." for i in range(40)]
    chunks = chunk_document(text_doc(" ".join(sentences)), size=200, overlap=40)
    assert len(chunks) > 5
    assert all(c.text.endswith(".") for c in chunks), [c.text[-20:] for c in chunks]

    no_punctuation = " ".join(f"word{i}" for i in range(300))
    chunks = chunk_document(text_doc(no_punctuation), size=100, overlap=20)
    source_words = set(no_punctuation.split())
    assert all(set(c.text.split()) <= source_words for c in chunks), "a word was cut"


def test_paragraph_breaks_kept_and_whitespace_collapsed() -> None:
    text = "  alpha   beta\t\tgamma \r\n\r\n\r\n\n   delta\u00a0 epsilon\nzeta  \n\n\n"
    chunks = chunk_document(text_doc(text))
    assert [c.text for c in chunks] == ["alpha beta gamma\n\ndelta epsilon\nzeta"]
    assert chunk_document(text_doc(" \n\n\t \r\n ")) == []
    assert chunk_document(text_doc("")) == []


def test_whole_paragraphs_stay_together_when_they_fit() -> None:
    paragraphs = [f"Paragraph {i} is short. It has two sentences." for i in range(30)]
    chunks = chunk_document(text_doc("\n\n".join(paragraphs)), size=200, overlap=0)
    for chunk in chunks:
        assert all(p.startswith("Paragraph") for p in chunk.text.split("\n\n"))
        assert chunk.text.endswith("sentences.")


def test_a_word_longer_than_size_is_cut_and_others_are_not() -> None:
    giant = "x" * 2000
    near = "y" * 790
    text = f"start words here {giant} middle {near} end"
    chunks = chunk_document(text_doc(text), size=800, overlap=120)
    assert all(len(c.text) <= 800 for c in chunks)
    pieces = [t for c in chunks for t in c.text.split() if set(t) == {"x"}]
    assert "".join(pieces) == giant  # cut into slices, none repeated, none lost
    assert [len(p) for p in pieces] == [800, 800, 400]
    assert sum(near in c.text.split() for c in chunks) >= 1, "a word within size was cut"
    assert not any(set(t) == {"y"} and t != near for c in chunks for t in c.text.split())
    assert chunks[-1].text.endswith("end")


def test_unicode_text() -> None:
    cjk = "".join(f"これは第{i}の文です。" for i in range(120))
    text = f"Café naïve — “quoted” déjà vu 🙂🚀.\n\n{cjk}\n\nΕλληνικά κείμενο εδώ."
    doc = parse_document("u.txt", b"\xef\xbb\xbf" + text.encode())
    assert doc.pages == [text], "the BOM is dropped, nothing else changes"
    chunks = chunk_document(doc, size=200, overlap=30)
    assert all(len(c.text) <= 200 for c in chunks)
    assert chunks[0].text.startswith("Café naïve — “quoted” déjà vu 🙂🚀.")
    assert chunks[-1].text.endswith("Ελληνικά κείμενο εδώ.")
    cjk_chunks = [c.text for c in chunks if "これ" in c.text]
    assert len(cjk_chunks) > 3
    assert all(t.endswith("。") for t in cjk_chunks[:-1]), "CJK splits at sentence ends"
    assert all(f"第{i}の文" in "".join(cjk_chunks) for i in range(120))
    assert any(a[-10:] in b for a, b in itertools.pairwise(cjk_chunks)), "overlap"


def test_chunking_is_deterministic_and_checks_arguments() -> None:
    doc = text_doc(prose(random.Random(1), 10))
    assert chunk_document(doc, size=120, overlap=30) == chunk_document(doc, size=120, overlap=30)
    for size, overlap in [(0, 0), (100, 100), (100, -1)]:
        with pytest.raises(ConfigError):
            chunk_document(doc, size=size, overlap=overlap)


# ── formats ──────────────────────────────────────────────────────────────────────────────────────


def test_pdf_pages_and_chunk_page_numbers() -> None:
    rng = random.Random(5)
    first, second = prose(rng, 4, "alpha"), prose(rng, 4, "bravo")
    doc = parse_document("two.pdf", make_pdf([first, second]))
    assert doc.media_type == "application/pdf"
    assert len(doc.pages) == 2
    assert "alpha0" in doc.pages[0] and "bravo" not in doc.pages[0]
    assert "bravo0" in doc.pages[1] and "alpha" not in doc.pages[1]

    chunks = chunk_document(doc, size=200, overlap=40)
    by_page = {page: [c for c in chunks if c.page == page] for page in (1, 2)}
    assert len(by_page[1]) > 1 and len(by_page[2]) > 1
    assert len(by_page[1]) + len(by_page[2]) == len(chunks)
    assert all("bravo" not in c.text for c in by_page[1]), "a chunk spans pages"
    assert all("alpha" not in c.text for c in by_page[2]), "a chunk spans pages"
    assert [c.page for c in chunks] == sorted(c.page or 0 for c in chunks)
    assert all(c.heading is None for c in chunks)
    words = {w for c in chunks for w in c.text.split()}
    assert set((first + " " + second).split()) <= words, "PDF text lost"


def test_markdown_headings() -> None:
    markdown = (
        "---\ntitle: Front matter\n# a YAML comment\n---\n"
        "Preface line.\n\n"
        "# Guide\n\n"
        "## Install\n\n"
        "Run the installer. It is quick.\n\n"
        "## Configure ##\n\n"
        "Edit the file.\n\n"
        "```sh\n# not a heading, a shell comment\nexport X=1\n```\n\n"
        "Still configuring.\n\n"
        "Usage\n=====\n\n"
        "Call it.\n\n"
        "#hashtag is text\n"
    )
    doc = parse_document("guide.md", markdown.encode())
    assert doc.media_type == "text/markdown"
    assert doc.pages == [markdown], "markdown is kept as written"
    chunks = chunk_document(doc)
    assert [(c.heading, c.text.split("\n")[0]) for c in chunks] == [
        (None, "---"),
        ("Install", "# Guide"),  # a heading with no text of its own joins the next section
        ("Configure", "## Configure ##"),
        ("Usage", "Usage"),
    ]
    assert "title: Front matter\n# a YAML comment\n---\nPreface line." in chunks[0].text
    assert "# not a heading" in chunks[2].text
    assert "Still configuring." in chunks[2].text
    assert "#hashtag is text" in chunks[3].text
    assert all(c.page is None for c in chunks)

    long_section = "# Only\n\n" + prose(random.Random(2), 8)
    chunks = chunk_document(text_doc(long_section, "text/markdown"), size=150, overlap=20)
    assert len(chunks) > 3
    assert all(c.heading == "Only" for c in chunks)


def test_html_visible_text_and_headings() -> None:
    html = """<!DOCTYPE html>
    <html><head><title>Page title</title>
      <style>body { color: red }</style>
      <script>var secret = "tracking";</script>
    </head>
    <body>
      <noscript>Enable JavaScript</noscript>
      <h1>Caf&eacute; &amp; Bar</h1>
      <p>Fish   &amp; chips &lt;tasty&gt; &#8212; &quot;fresh&quot;<br>second line</p>
      <script type="module">import("x")</script>
      <h2>Menu <small>today</small></h2>
      <ul><li>Soup</li><li>Bread</li></ul>
      <p># not a heading</p>
      <table><tr><td>a</td><td>b</td></tr></table>
    </body></html>"""
    doc = parse_document("page.html", html.encode())
    assert doc.media_type == "text/html"
    text = doc.pages[0]
    for hidden in ("Page title", "color", "secret", "tracking", "import", "JavaScript"):
        assert hidden not in text
    assert 'Fish & chips <tasty> — "fresh"\nsecond line' in text
    assert "Soup\nBread" in text
    assert "a b" in text
    assert "&" + "amp;" not in text

    chunks = chunk_document(doc)
    assert [(c.heading, c.text.split("\n")[0]) for c in chunks] == [
        ("Café & Bar", "# Café & Bar"),
        ("Menu today", "## Menu today"),
    ]
    assert "# not a heading" in chunks[1].text


def test_html_without_closing_head_keeps_the_body() -> None:
    doc = parse_document("x.htm", b"<html><head><title>t</title><body><p>Body text</p>")
    assert doc.pages == ["Body text"]


def test_load_path(tmp_path: Path) -> None:
    path = tmp_path / "notes.markdown"
    path.write_bytes(b"# Notes\n\nSome notes.\n")
    doc = load_path(path)
    assert doc == ParsedDocument("notes.markdown", "text/markdown", ["# Notes\n\nSome notes.\n"])
    assert load_path(str(path)) == doc


# ── media types ──────────────────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("name", "data", "declared", "expected"),
    [
        ("a.bin", b"hello", "text/markdown; charset=utf-8", "text/markdown"),
        ("a.txt", b"<html>", "TEXT/HTML; charset=ISO-8859-1", "text/html"),
        ("a.txt", b"%PDF-1.7", "application/x-pdf", "application/pdf"),
        ("a.md", b"# x", "application/octet-stream", "text/markdown"),
        ("notes.csv", b"a,b", "text/csv", "text/plain"),
        ("A.TXT", b"x", None, "text/plain"),
        ("a.text", b"x", None, "text/plain"),
        ("a.MD", b"x", None, "text/markdown"),
        ("a.markdown", b"x", None, "text/markdown"),
        ("a.htm", b"x", None, "text/html"),
        ("a.html", b"x", None, "text/html"),
        ("a.pdf", b"x", None, "application/pdf"),
        ("upload", b"%PDF-1.4\n...", None, "application/pdf"),
        ("upload", b"\n  <!DOCTYPE HTML><p>x", None, "text/html"),
        ("upload", b"<html lang=en>", None, "text/html"),
        ("upload", "plain ünïcode".encode(), "", "text/plain"),
        ("README", "\ufeffwith BOM".encode(), None, "text/plain"),
    ],
)
def test_detect_media_type(name: str, data: bytes, declared: str | None, expected: str) -> None:
    assert detect_media_type(name, data, declared) == expected


def test_parse_uses_a_declared_charset() -> None:
    doc = parse_document("x", b"caf\xe9", "text/plain; charset=ISO-8859-1")
    assert doc == ParsedDocument("x", "text/plain", ["café"])
    doc = parse_document("x", "hi ☃".encode("utf-16"))
    assert doc.pages == ["hi ☃"]
    doc = parse_document("x", "\ufeffhi".encode(), "text/markdown; charset=UTF-8")
    assert doc.pages == ["hi"], "a BOM is accepted when UTF-8 is declared too"


# ── errors ───────────────────────────────────────────────────────────────────────────────────────


def test_invalid_utf8_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match=r"not valid UTF-8.*0xff at offset 4"):
        parse_document("bad.txt", b"good\xff bad")
    with pytest.raises(InvalidInput, match="unknown charset"):
        parse_document("x", b"x", "text/plain; charset=no-such-codec")


def test_binary_and_unsupported_types_are_invalid_input() -> None:
    noise = random.Random(0).randbytes(4096)
    for call in (
        lambda: detect_media_type("blob", noise),
        lambda: parse_document("blob.bin", noise),
        lambda: parse_document("blob.txt", noise),
        lambda: parse_document("zeros", b"\x00" * 64),
        lambda: parse_document("image.png", b"\x89PNG\r\n", "image/png"),
    ):
        with pytest.raises(InvalidInput):
            call()


def test_broken_pdfs_are_invalid_input() -> None:
    good = make_pdf(["Some text on a page."])
    for broken in (b"%PDF-1.4\nnot really a pdf", good[: len(good) // 2], b"", b"%PDF-"):
        with pytest.raises(InvalidInput, match="not a readable PDF"):
            parse_document("broken.pdf", broken)
    with pytest.raises(InvalidInput, match="encrypted"):
        parse_document("locked.pdf", make_pdf(["secret"], user_password="pw"))
    with pytest.raises(InvalidInput, match="no extractable text"):
        parse_document("blank.pdf", make_pdf(["", ""]))


def test_owner_password_only_pdf_is_readable() -> None:
    pdf = FPDF()
    pdf.set_encryption(owner_password="owner")  # no user password: readers open it freely
    pdf.add_page()
    pdf.set_font("Helvetica")
    pdf.cell(text="open to all")
    assert parse_document("open.pdf", bytes(pdf.output())).pages == ["open to all"]


def test_too_large(tmp_path: Path) -> None:
    with pytest.raises(TooLarge):
        parse_document("big.txt", b"a" * (MAX_DOCUMENT_BYTES + 1))
    at_bound = b"a" * MAX_DOCUMENT_BYTES
    assert parse_document("edge.txt", at_bound).pages == [at_bound.decode()]
    big = tmp_path / "big.txt"
    with big.open("wb") as fh:
        fh.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(TooLarge):
        load_path(big)


def test_unreadable_path_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_path(tmp_path / "missing.txt")
    with pytest.raises(InvalidInput, match="cannot read"):
        load_path(tmp_path)


# ── speed (printed, not asserted) ────────────────────────────────────────────────────────────────


def test_chunking_speed() -> None:
    text = prose(random.Random(11), 12_000)
    while len(text) < 2 * 1024 * 1024:
        text += "\n\n" + text
    text = text[: 2 * 1024 * 1024]
    started = time.perf_counter()
    chunks = chunk_document(text_doc(text))
    elapsed = time.perf_counter() - started
    assert len(chunks) > len(text) // 800
    rate = len(chunks) / elapsed
    print(f"\nchunk 2 MB text: {len(chunks)} chunks in {elapsed:.3f}s, {rate:.0f} chunks/s")

    data = make_pdf([prose(random.Random(page), 6, f"p{page}w") for page in range(20)])
    started = time.perf_counter()
    doc = parse_document("twenty.pdf", data)
    parsed = time.perf_counter()
    chunks = chunk_document(doc)
    done = time.perf_counter()
    assert len(doc.pages) == 20
    assert {c.page for c in chunks} == set(range(1, 21))
    print(
        f"20-page PDF: parse {parsed - started:.3f}s, chunk {done - parsed:.4f}s,"
        f" {len(chunks)} chunks, {len(chunks) / (done - started):.0f}/s end to end"
    )
