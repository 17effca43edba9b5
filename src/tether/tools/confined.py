"""Paths a model names, opened inside the session's workspace and nowhere else.

A path is walked one component at a time from a descriptor of the workspace: each directory is
opened relative to the one before (``openat``) with ``O_NOFOLLOW | O_DIRECTORY``, and the last
component with ``O_NOFOLLOW``. Checking a step and taking it are one system call, so a symlink
swapped in between a check and a use (by the session's own sandbox, say) cannot lead out: there
is no moment at which a name is looked up twice.

Refused, with the path as the model gave it (never the host path, which would show the data
dir): absolute paths, ``..``, NUL bytes, every symbolic link (even one pointing inside: a link
is a name whose meaning can change under us), regular files with more than one hard link (the
other name may be another session's file), and anything but regular files and directories
(devices, FIFOs, sockets).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from tether.errors import ToolError
from tether.tools.context import ToolContext
from tether.tools.workspace import ensure_workspace

MAX_PATH_CHARS = 1024
"""Longer paths are refused before any system call sees them."""

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO swapped in after the check returns at once instead of waiting for
# a writer; O_NOCTTY: a terminal swapped in never becomes the server's controlling terminal.
FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def shown(path: str) -> str:
    """The path as the model gave it, quoted, cut short if long."""
    text = repr(path)
    return text if len(text) <= 200 else text[:197] + "..."


@dataclass(frozen=True, slots=True)
class Target:
    """A path inside the workspace, checked for form (not yet for what it names)."""

    given: str
    """As the model wrote it; every message names this."""
    parts: tuple[str, ...]
    """Its components, ``.`` and empty ones dropped; empty for the workspace itself."""

    @property
    def label(self) -> str:
        return shown(self.given)

    @property
    def relative(self) -> str:
        """The path from the workspace's top (``.`` for the top itself)."""
        return "/".join(self.parts) or "."


def target(path: str) -> Target:
    """The path's components; ToolError when its form alone would leave the workspace."""
    label = shown(path)
    if "\x00" in path:
        raise ToolError(f"{label} holds a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise ToolError(f"{label} is longer than {MAX_PATH_CHARS} characters")
    if path.startswith("/"):
        raise ToolError(
            f"{label} is an absolute path; file tools take paths relative to the workspace"
        )
    parts = tuple(p for p in path.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ToolError(f"{label} climbs with '..'; file tools stay inside the workspace")
    return Target(path, parts)


def kind_refusal(t: Target, mode: int, nlink: int, prefix: str | None = None) -> str | None:
    """Why a file tool will not open what ``mode`` describes (None for a regular file of one
    name, or a directory). ``prefix`` names the component at fault when it is not the last."""
    where = t.label if prefix is None or prefix == t.relative else f"{t.label}: {prefix!r}"
    if stat.S_ISLNK(mode):
        return f"{where} is a symbolic link; file tools do not follow links"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"{where} is a device file; file tools open regular files only"
    if stat.S_ISFIFO(mode):
        return f"{where} is a named pipe; file tools open regular files only"
    if stat.S_ISSOCK(mode):
        return f"{where} is a socket; file tools open regular files only"
    if stat.S_ISREG(mode) and nlink > 1:
        return (
            f"{where} has {nlink} hard links; file tools refuse hard-linked files "
            "(another name may belong to someone else)"
        )
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"{where} is not a regular file or directory"
    return None


def not_found(t: Target) -> ToolError:
    return ToolError(f"{t.label} not found in the workspace")


def _failed(t: Target, dir_fd: int, name: str, prefix: str, exc: OSError) -> ToolError:
    """The refusal for a component that would not open: what it is, looked at without
    following it."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return not_found(t)
    except OSError:
        st = None
    if st is not None:
        why = kind_refusal(t, st.st_mode, 1, prefix)
        if why is not None:
            return ToolError(why)
        if exc.errno == errno.ENOTDIR and not stat.S_ISDIR(st.st_mode):
            where = t.label if prefix == t.relative else f"{t.label}: {prefix!r}"
            return ToolError(f"{where} is a file, not a directory")
    return ToolError(f"{t.label}: {os.strerror(exc.errno or errno.EIO).lower()}")


@contextlib.contextmanager
def closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def _root(ctx: ToolContext, *, create: bool) -> int | None:
    if ctx.workspace is None:
        raise ToolError("this runtime has no workspaces")
    if create:
        ensure_workspace(ctx.workspace)
    try:
        return os.open(ctx.workspace, DIR_FLAGS)
    except FileNotFoundError:
        return None  # nothing written yet: an empty workspace
    except OSError as exc:
        raise ToolError(f"the workspace cannot be opened: {os.strerror(exc.errno or 0)}") from None


def open_dir(ctx: ToolContext, t: Target, parts: tuple[str, ...], *, create: bool) -> int | None:
    """A descriptor (the caller closes it) of the directory ``parts`` (a prefix of ``t``'s)
    names; None when it does not exist and ``create`` is false. With ``create``, missing
    directories are made (0700), the workspace first."""
    fd = _root(ctx, create=create)
    if fd is None:
        return None
    for depth, name in enumerate(parts, start=1):
        prefix = "/".join(parts[:depth])
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o700, dir_fd=fd)
            step = os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            os.close(fd)
            return None
        except OSError as exc:
            refusal = _failed(t, fd, name, prefix, exc)
            os.close(fd)
            raise refusal from None
        os.close(fd)
        fd = step
    return fd


def lstat_in(dir_fd: int, name: str) -> os.stat_result | None:
    """What ``name`` in the directory is, without following it; None when it is absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_file(
    t: Target, dir_fd: int, name: str, flags: int, before: os.stat_result | None
) -> tuple[int, os.stat_result]:
    """Open the regular file ``name`` (``before``: what an lstat saw, None if it was absent) and
    check, on the open descriptor, that it is still a regular file with one name, the same one
    the caller checked: a file swapped in between is refused, never written through."""
    try:
        fd = os.open(name, flags | FILE_FLAGS, 0o600, dir_fd=dir_fd)
    except FileNotFoundError:
        raise not_found(t) from None
    except OSError as exc:
        raise _failed(t, dir_fd, name, t.relative, exc) from None
    st = os.fstat(fd)
    why = kind_refusal(t, st.st_mode, st.st_nlink)
    if why is None and stat.S_ISDIR(st.st_mode):
        why = f"{t.label} is a directory"
    swapped = before is not None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino)
    if why is None and swapped:
        why = f"{t.label} changed while it was being opened; try again"
    if why is not None:
        os.close(fd)
        raise ToolError(why)
    return fd, st


def start_dir(ctx: ToolContext, t: Target) -> int | None:
    """A descriptor of the directory a listing or search starts at; None for the top of a
    workspace not made yet (empty), ToolError for any other path that is not there."""
    fd = open_dir(ctx, t, t.parts, create=False)
    if fd is None and t.parts:
        raise not_found(t)
    return fd
