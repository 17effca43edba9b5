"""A PDF that is small on disk and enormous once read: every page draws one shared content stream.

The stream is stored once, compressed (it repeats one short text operation, so it deflates to a
few kilobytes), and each page's ``/Contents`` points at it: a reader extracts its text once per
page. ``content_stream_bomb(pages=50)`` is about 11 KB and holds 11 million characters of text.
"""

from __future__ import annotations

import io

from pypdf import PdfWriter
from pypdf.generic import ContentStream, DictionaryObject, NameObject

LINE = b"(lorem ipsum) Tj\n"
"""One text operation: 11 characters of text for 17 bytes of content."""


def content_stream_bomb(pages: int = 50, operations: int = 20_000) -> bytes:
    """A PDF of ``pages`` pages sharing one content stream of ``operations`` text operations
    (``pages * operations * 11`` characters of text)."""
    writer = PdfWriter()
    first = writer.add_blank_page(612, 792)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    first[NameObject("/Resources")] = DictionaryObject(
        {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
    )
    stream = ContentStream(None, None)
    stream.set_data(b"BT /F1 12 Tf 72 720 Td\n" + LINE * operations + b"ET\n")
    first.replace_contents(stream)
    first.compress_content_streams()
    for _ in range(pages - 1):
        page = writer.add_blank_page(612, 792)
        # The same indirect objects, not copies: the stream is written to the file once.
        page[NameObject("/Contents")] = first.raw_get("/Contents")
        page[NameObject("/Resources")] = first.raw_get("/Resources")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()
