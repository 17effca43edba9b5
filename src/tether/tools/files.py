"""File tools confined to the session's workspace (DESIGN §7), opt-in per agent::

    Agent(name="writer", tools=[*FILE_TOOLS])           # read, write, append, list, search, delete
    Agent(name="reader", tools=[*READ_ONLY_FILE_TOOLS])  # read, list, search

Every path is relative to the workspace and opened through :mod:`tether.tools.confined`, which
refuses absolute paths, ``..``, symbolic links, hard-linked files and anything but regular files
and directories. Reads, writes and searches are capped so that one call cannot flood the model's
context or the disk; writes also count against the workspace quota. Files are UTF-8 text.
"""

from __future__ import annotations

import codecs
import os
import stat
from dataclasses import dataclass

from tether.errors import ToolError
from tether.tools.confined import (
    Target,
    closing,
    kind_refusal,
    lstat_in,
    not_found,
    open_dir,
    open_file,
    start_dir,
    target,
)
from tether.tools.context import ToolContext
from tether.tools.file_search import SEARCH_MATCH_LIMIT, search_files
from tether.tools.tool import Tool, tool
from tether.tools.workspace import check_quota

__all__ = [
    "FILE_TOOLS",
    "LIST_LIMIT",
    "READ_LIMIT_BYTES",
    "READ_ONLY_FILE_TOOLS",
    "SEARCH_MATCH_LIMIT",
    "WRITE_LIMIT_BYTES",
    "append_file",
    "delete_file",
    "list_files",
    "read_file",
    "search_files",
    "write_file",
]

READ_LIMIT_BYTES = 256 * 1024
"""The most one ``read_file`` call returns; ``offset`` and ``limit`` reach the rest."""
WRITE_LIMIT_BYTES = 1024 * 1024
"""The most one ``write_file`` or ``append_file`` call writes (the quota bounds the total)."""
LIST_LIMIT = 1000
"""Entries one ``list_files`` call shows."""
_CHUNK = 64 * 1024


def _parent(ctx: ToolContext, t: Target, *, create: bool) -> int | None:
    if not t.parts:
        raise ToolError(f"{t.label} names the workspace itself, not a file in it")
    return open_dir(ctx, t, t.parts[:-1], create=create)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _encoded(t: Target, content: str) -> bytes:
    # A lone surrogate (valid JSON, not valid UTF-8) is written as "?" rather than refused.
    data = content.encode("utf-8", errors="replace")
    if len(data) > WRITE_LIMIT_BYTES:
        raise ToolError(
            f"{t.label}: {len(data):,} bytes is more than one call may write "
            f"({WRITE_LIMIT_BYTES:,}); write the first part, then append_file the rest"
        )
    return data


def _kb(n: int) -> str:
    return f"{n // 1024} KB"


# -- read ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Read:
    data: bytes
    """Whole lines from ``offset`` on, within the limits (the last may be cut by the byte cap)."""
    lines_before: int
    """Lines passed to reach ``offset``: fewer than ``offset - 1`` when the file ends first."""
    more: bool
    """The file goes on past ``data``."""


def _read_text(fd: int, offset: int, limit: int | None) -> _Read:
    with open(fd, "rb", closefd=False) as f:
        line, partial = 1, False
        while line < offset:
            chunk = f.readline(_CHUNK)
            if not chunk:
                return _Read(b"", line - 1 + partial, False)
            partial = not chunk.endswith(b"\n")
            line += not partial
        out = bytearray()
        taken = 0
        while (limit is None or taken < limit) and len(out) < READ_LIMIT_BYTES:
            chunk = f.readline(READ_LIMIT_BYTES - len(out))
            if not chunk:
                break
            out += chunk
            taken += chunk.endswith(b"\n")
        return _Read(bytes(out), offset - 1, bool(f.read(1)))


def _decode(t: Target, data: bytes) -> tuple[str, bool]:
    if b"\x00" in data:
        raise ToolError(f"{t.label} looks binary (it holds NUL bytes); file tools read text only")
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        # final=False: a character cut by the read limit is left out rather than mangled.
        return decoder.decode(data, final=False), False
    except UnicodeDecodeError:
        return data.decode("utf-8", errors="replace"), True


@tool(name="read_file", read_only=True)
def read_file(ctx: ToolContext, path: str, offset: int = 1, limit: int | None = None) -> str:
    """Read a text file from your workspace.

    Args:
        path: The file's path, relative to the workspace.
        offset: The line to start at (1 is the first line).
        limit: The most lines to read (default: as many as fit in 256 KB).
    """
    t = target(path)
    if offset < 1:
        raise ToolError("offset is a line number: 1 for the first line")
    if limit is not None and limit < 1:
        raise ToolError("limit is a number of lines, 1 or more")
    parent = _parent(ctx, t, create=False)
    if parent is None:
        raise not_found(t)
    with closing(parent):
        before = lstat_in(parent, t.parts[-1])
        if before is None:
            raise not_found(t)
        if stat.S_ISDIR(before.st_mode):
            raise ToolError(f"{t.label} is a directory; list_files shows what it holds")
        why = kind_refusal(t, before.st_mode, before.st_nlink)
        if why is not None:
            raise ToolError(why)
        fd, _ = open_file(t, parent, t.parts[-1], os.O_RDONLY, before)
    with closing(fd):
        read = _read_text(fd, offset, limit)
    data = read.data
    if not data:
        if offset == 1:
            return f"[{t.label} is empty]"
        return f"[{t.label} has {read.lines_before} lines; there is no line {offset}]"
    text, replaced = _decode(t, data)
    notes = []
    if replaced:
        notes.append("not valid UTF-8: undecodable bytes are shown as U+FFFD")
    if read.more:
        lines = data.count(b"\n")
        last = offset + lines - 1
        if data.endswith(b"\n"):
            notes.append(
                f"lines {offset}-{last} shown; the file goes on: "
                f"read_file with offset={last + 1} for more"
            )
        else:
            notes.append(
                f"line {last + 1} is cut at the read limit of {_kb(READ_LIMIT_BYTES)}; "
                f"read_file with offset={last + 2} reads from the line after it"
            )
    if notes:
        text = f"{text}{'' if text.endswith(chr(10)) else chr(10)}[{'; '.join(notes)}]"
    return text


# -- write, append, delete -------------------------------------------------------------------


def _writable(ctx: ToolContext, t: Target) -> tuple[int, os.stat_result | None]:
    """The parent directory (made if missing) and what the last component is now."""
    parent = _parent(ctx, t, create=True)
    assert parent is not None  # made if missing
    before = lstat_in(parent, t.parts[-1])
    if before is not None:
        why = kind_refusal(t, before.st_mode, before.st_nlink)
        if why is None and stat.S_ISDIR(before.st_mode):
            why = f"{t.label} is a directory"
        if why is not None:
            os.close(parent)
            raise ToolError(why)
    return parent, before


@tool(name="write_file")
def write_file(ctx: ToolContext, path: str, content: str) -> str:
    """Write a text file in your workspace, replacing what it held; missing directories are made.

    Args:
        path: The file's path, relative to the workspace.
        content: The whole new content (at most 1 MB; use append_file for more).
    """
    t = target(path)
    data = _encoded(t, content)
    parent, before = _writable(ctx, t)
    assert ctx.workspace is not None
    with closing(parent):
        check_quota(ctx.workspace, ctx.workspace_quota, len(data), before.st_size if before else 0)
        # No O_TRUNC: the open descriptor is checked first, so a hard link swapped in is
        # refused before anything is cut.
        fd, _ = open_file(t, parent, t.parts[-1], os.O_WRONLY | os.O_CREAT, before)
    with closing(fd):
        os.ftruncate(fd, 0)
        _write_all(fd, data)
    return f"wrote {len(data):,} bytes to {t.label}"


@tool(name="append_file")
def append_file(ctx: ToolContext, path: str, content: str) -> str:
    """Add text to the end of a file in your workspace (made if missing).

    Args:
        path: The file's path, relative to the workspace.
        content: The text to add (at most 1 MB per call).
    """
    t = target(path)
    data = _encoded(t, content)
    parent, before = _writable(ctx, t)
    assert ctx.workspace is not None
    with closing(parent):
        check_quota(ctx.workspace, ctx.workspace_quota, len(data))
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        fd, _ = open_file(t, parent, t.parts[-1], flags, before)
    with closing(fd):
        _write_all(fd, data)
        size = os.fstat(fd).st_size
    return f"appended {len(data):,} bytes to {t.label}, which now holds {size:,} bytes"


@tool(name="delete_file")
def delete_file(ctx: ToolContext, path: str) -> str:
    """Delete a file, or an empty directory, from your workspace.

    Args:
        path: The path, relative to the workspace.
    """
    t = target(path)
    parent = _parent(ctx, t, create=False)
    if parent is None:
        raise not_found(t)
    with closing(parent):
        name = t.parts[-1]
        st = lstat_in(parent, name)
        if st is None:
            raise not_found(t)
        why = kind_refusal(t, st.st_mode, st.st_nlink)
        if why is not None:
            raise ToolError(why)
        if stat.S_ISDIR(st.st_mode):
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                raise ToolError(f"{t.label} is a directory that is not empty") from None
            return f"deleted the directory {t.label}"
        # unlink removes a name, never what a name points at: a link swapped in since the
        # check is removed itself, and nothing outside the workspace changes.
        os.unlink(name, dir_fd=parent)
        return f"deleted {t.label}"


# -- list ----------------------------------------------------------------------------------


def _describe(entry: os.DirEntry[str]) -> str | None:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:  # removed since the directory was read
        return None
    if stat.S_ISDIR(st.st_mode):
        return f"{entry.name}/"
    if stat.S_ISLNK(st.st_mode):
        return f"{entry.name}  (symbolic link, not followed)"
    if not stat.S_ISREG(st.st_mode):
        return f"{entry.name}  (not a regular file)"
    links = f", {st.st_nlink} hard links" if st.st_nlink > 1 else ""
    return f"{entry.name}  ({st.st_size:,} bytes{links})"


@tool(name="list_files", read_only=True)
def list_files(ctx: ToolContext, path: str = ".") -> str:
    """List a directory of your workspace: subdirectories end in '/', files show their size.

    Args:
        path: The directory, relative to the workspace ('.' for its top).
    """
    t = target(path)
    fd = start_dir(ctx, t)
    if fd is None:
        return "[the workspace is empty]"
    with closing(fd), os.scandir(fd) as entries:
        names = sorted(entries, key=lambda e: e.name)
        lines = [d for e in names[:LIST_LIMIT] if (d := _describe(e)) is not None]
    if not lines:
        return f"[{t.label} is empty]" if t.parts else "[the workspace is empty]"
    if len(names) > LIST_LIMIT:
        lines.append(f"[{len(names) - LIST_LIMIT:,} more entries not shown]")
    return "\n".join(lines)


FILE_TOOLS: tuple[Tool, ...] = (
    read_file,
    write_file,
    append_file,
    list_files,
    search_files,
    delete_file,
)
"""Every file tool: ``Agent(tools=[*FILE_TOOLS])``."""
READ_ONLY_FILE_TOOLS: tuple[Tool, ...] = (read_file, list_files, search_files)
"""The file tools that change nothing."""
