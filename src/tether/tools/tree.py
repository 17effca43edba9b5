"""Walking, measuring and removing a directory tree that a sandbox may be changing under us.

A workspace's contents are written by sandboxed code (and by stdio MCP servers still running
there), so every path in it may be swapped between a look and a use: a directory for a symlink
to ``/`` or for a FIFO. Everything here goes by file descriptor: each directory is opened
relative to its parent with ``O_NOFOLLOW | O_DIRECTORY | O_NONBLOCK`` (a link or a FIFO swapped
in fails to open, never blocks, never leads out), entries are looked at without following
links, and nothing recurses in Python (a tree thousands deep is one ``mkdir a; cd a`` loop).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 128
"""Directories below this depth are not walked (each level holds a descriptor open)."""


class TooDeep(Exception):
    """The tree goes deeper than :data:`MAX_DEPTH`."""


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int | None:
    """A descriptor of the directory ``name`` (None when it is gone or is not a directory)."""
    try:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink swapped in
            return None
        raise


def _open_root(root: Path) -> int | None:
    """``root`` opened as a directory; one the sandbox made unreadable (000) is made ours
    again first (the root is tether's own directory: never a link the sandbox could swap)."""
    try:
        return _open_dir(root)
    except PermissionError:
        os.chmod(root, 0o700)
        return _open_dir(root)


def _names(fd: int, dirs_only: bool) -> list[str]:
    """The names in the directory ``fd``; ``dirs_only``: only those of directories (by the
    type the listing gives, so nothing else is looked at)."""
    if not dirs_only:
        return os.listdir(fd)
    with os.scandir(fd) as entries:
        return [e.name for e in entries if e.is_dir(follow_symlinks=False)]


def _listed(name: str, dir_fd: int, dirs_only: bool = False) -> tuple[int, list[str]] | None:
    """The directory ``name`` opened and listed (None when it is gone or no longer a
    directory); one the sandbox made unreadable is let in first."""
    for attempt in range(2):
        try:
            fd = _open_dir(name, dir_fd)
        except PermissionError:
            fd = None
            if attempt == 0:
                _let_in(name, dir_fd)
                continue
            raise
        if fd is None:
            return None
        try:
            return fd, _names(fd, dirs_only)
        except PermissionError:
            os.close(fd)
            if attempt == 1:
                raise
            _let_in(name, dir_fd)
    return None


def walk(
    root: Path, *, only_dirs_in: Callable[[os.stat_result], bool] | None = None
) -> Iterator[tuple[int, str, os.stat_result]]:
    """Every entry below ``root`` as ``(its directory's descriptor, its name, its lstat)``, a
    directory before what it holds. TooDeep past :data:`MAX_DEPTH`. The descriptor is valid
    until the next step. ``only_dirs_in``: in a directory below the root for whose lstat it
    holds, only the directories are walked (and their own insides as this says)."""
    top = _open_root(root)
    if top is None:
        return
    stack: list[tuple[int, Iterator[str]]] = [(top, iter(os.listdir(top)))]
    try:
        while stack:
            fd, names = stack[-1]
            name = next(names, None)
            if name is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile
            yield fd, name, info
            if stat.S_ISDIR(info.st_mode):
                if len(stack) >= MAX_DEPTH:
                    raise TooDeep(f"nested deeper than {MAX_DEPTH} directories")
                dirs_only = only_dirs_in is not None and only_dirs_in(info)
                child = _listed(name, fd, dirs_only)
                if child is not None:
                    stack.append((child[0], iter(child[1])))
    finally:
        for fd, _ in stack:
            os.close(fd)


def size(root: Path) -> int:
    """Bytes of everything below ``root`` (links count for themselves). TooDeep past
    :data:`MAX_DEPTH`."""
    return sum(info.st_size for _, _, info in walk(root))


def chown_all(root: Path, uid: int, gid: int, *, unchanged_before: int | None = None) -> int | None:
    """Give ``root`` and everything below it to ``uid``/``gid``, never through a link (a link
    is changed itself); a file with more than one name is left alone (another name may be
    outside). Deeper than :data:`MAX_DEPTH` is left as it is: what is there was made inside.

    Returns a stamp for the next hand-over of the same tree: the root's ctime, which its chown
    here sets before the walk, by the filesystem's own clock. Given back as
    ``unchanged_before`` (less a margin for the clock), a directory whose ctime is older has
    had no entry made, renamed or removed in it since that walk looked (any of those sets its
    ctime, and no program can set a ctime back), so what it holds is still handed over and
    only its subdirectories are looked at. An entry of someone else's can only have come in as
    a new one. What a wrong stamp can cost is a file the sandbox cannot write, never more.
    None instead when the walk stopped too deep: it did not see everything, so the next one
    must look everywhere again.
    """
    os.chown(root, uid, gid, follow_symlinks=False)
    stamp = os.stat(root, follow_symlinks=False).st_ctime_ns

    def unchanged(info: os.stat_result) -> bool:
        return unchanged_before is not None and info.st_ctime_ns < unchanged_before

    try:
        for fd, name, info in walk(root, only_dirs_in=unchanged):
            if (info.st_uid, info.st_gid) == (uid, gid):
                continue
            if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    except TooDeep:
        return None
    return stamp


def _let_in(name: str, dir_fd: int) -> None:
    """Make the directory ``name`` ours to list and empty (the sandbox may have made it 000),
    through an ``O_PATH`` descriptor of that very directory, never a link."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    with contextlib.suppress(OSError):
        fd = os.open(name, flags, dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)


def remove(root: Path) -> None:
    """Delete ``root`` and everything below it, however deep, never through a link.

    Past :data:`MAX_DEPTH` a directory is moved up to ``root`` (a rename within it) and emptied
    from there, so no more than that many descriptors are ever open.
    """
    top = _open_root(root)
    if top is None:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(root)  # a file or a link where the tree was: the link itself goes
        return
    moved = itertools.count()
    # Each frame: a directory's descriptor, the names left in it, its own name in the frame
    # below (None for the root).
    stack: list[tuple[int, list[str], str | None]] = [(top, os.listdir(top), None)]
    try:
        while stack:
            fd, names, own = stack[-1]
            if not names:
                os.close(fd)
                stack.pop()
                if stack and own is not None:
                    with contextlib.suppress(FileNotFoundError):
                        os.rmdir(own, dir_fd=stack[-1][0])
                continue
            name = names.pop()
            try:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(info.st_mode):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
                continue
            if len(stack) >= MAX_DEPTH:
                up = f".tether-removing-{next(moved)}"
                os.rename(name, up, src_dir_fd=fd, dst_dir_fd=top)
                stack[0][1].append(up)
                continue
            listed = _listed(name, fd)
            if listed is None:  # swapped for a link or a file meanwhile: unlink that
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    os.unlink(name, dir_fd=fd)
                continue
            stack.append((listed[0], listed[1], name))
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(root)
