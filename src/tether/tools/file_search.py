"""``search_files``: lines holding a pattern, in the text files of the session's workspace.

The walk opens each directory relative to the one above it with ``O_NOFOLLOW`` and each file
through :func:`~tether.tools.confined.open_file`, so it never leaves the workspace; links,
hard-linked, binary and special files are passed by (and counted in the result).

A regular expression runs in Python's ``re``, which has no time limit: a pathological pattern
can hold the worker thread. The search checks ``ToolContext.cancelled`` between files and stops
when its call times out, but cannot stop inside one ``re.search``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field

from tether.errors import ToolError
from tether.tools.confined import DIR_FLAGS, closing, open_file, start_dir, target
from tether.tools.context import ToolContext
from tether.tools.tool import tool

SEARCH_MATCH_LIMIT = 100
"""Matching lines one ``search_files`` call shows."""
SEARCH_FILE_BYTES = 4 * 1024 * 1024
"""How much of each file a search reads."""
SEARCH_DEPTH = 32
"""Directories deeper than this below the search's start are not searched."""
_SHOWN_LINE_CHARS = 300


@dataclass(slots=True)
class _Search:
    matches: Callable[[str], bool]
    ctx: ToolContext
    found: list[str] = field(default_factory=list)
    skipped: int = 0
    """Files not searched: links, binary files, special and hard-linked files."""
    deep: bool = False
    stopped: bool = False

    def full(self) -> bool:
        return len(self.found) >= SEARCH_MATCH_LIMIT or self.stopped

    def directory(self, fd: int, relative: str, depth: int) -> None:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            if self.full():
                return
            if self.ctx.cancelled.is_set():  # timed out: the thread is told to stop
                self.stopped = True
                return
            shown_path = f"{relative}/{entry.name}" if relative != "." else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:  # removed since the directory was read
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= SEARCH_DEPTH:
                    self.deep = True
                    continue
                try:
                    sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                except OSError:  # swapped for a link or removed meanwhile
                    self.skipped += 1
                    continue
                with closing(sub):
                    self.directory(sub, shown_path, depth + 1)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                self.file(fd, entry.name, shown_path, st)
            else:
                self.skipped += 1

    def file(self, dir_fd: int, name: str, shown_path: str, before: os.stat_result) -> None:
        try:
            fd, _ = open_file(target(shown_path), dir_fd, name, os.O_RDONLY, before)
        except ToolError:
            self.skipped += 1
            return
        with closing(fd), open(fd, "rb", closefd=False) as f:
            data = f.read(SEARCH_FILE_BYTES)
        if b"\x00" in data[:8192]:
            self.skipped += 1
            return
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if self.matches(line):
                text = line.strip()
                if len(text) > _SHOWN_LINE_CHARS:
                    text = text[:_SHOWN_LINE_CHARS] + "..."
                self.found.append(f"{shown_path}:{number}: {text}")
                if self.full():
                    return


def _matcher(pattern: str, regex: bool) -> Callable[[str], bool]:
    if not pattern:
        raise ToolError("the pattern is empty")
    if not regex:
        return lambda line: pattern in line
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"{pattern!r} is not a valid regular expression: {exc}") from None
    return lambda line: compiled.search(line) is not None


@tool(name="search_files", read_only=True, timeout=30)
def search_files(ctx: ToolContext, pattern: str, path: str = ".", regex: bool = False) -> str:
    """Search the text files of your workspace for lines holding a pattern; each match is
    shown as file:line: text.

    Args:
        pattern: The text to look for (a Python regular expression when regex is true).
        path: The directory to search in, relative to the workspace ('.' for all of it).
        regex: Treat the pattern as a regular expression rather than plain text.
    """
    matches = _matcher(pattern, regex)
    t = target(path)
    search = _Search(matches, ctx)
    fd = start_dir(ctx, t)
    if fd is None:
        return f"no matches for {pattern!r}: the workspace is empty"
    with closing(fd):
        search.directory(fd, t.relative, 0)
    notes = []
    if len(search.found) >= SEARCH_MATCH_LIMIT:
        notes.append(f"stopped at {SEARCH_MATCH_LIMIT} matches; search a narrower path or pattern")
    if search.stopped:
        notes.append("stopped: the search ran out of time")
    if search.deep:
        notes.append(f"directories more than {SEARCH_DEPTH} levels down were not searched")
    if search.skipped:
        notes.append(f"{search.skipped} links, binary or special files were not searched")
    lines = search.found or [f"no matches for {pattern!r} in {t.label}"]
    return "\n".join([*lines, *(f"[{n}]" for n in notes)])
