"""A workspace's tree as sandboxed code may leave it: thousands deep, modes taken away, links
out, FIFOs where directories were. Measuring, handing over and removing it never follows a
link out, never blocks, and never gives up half way (DESIGN §7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tether.errors import ToolError
from tether.tools import tree
from tether.tools.workspace import remove_tree, usage


def _deep(root: Path, depth: int) -> Path:
    """``root/d/d/…`` ``depth`` levels down (made by descriptor: the path would be too long)."""
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("x")
    finally:
        os.close(fd)
    return root


def test_a_tree_thousands_deep_is_removed(tmp_path: Path) -> None:
    ws = _deep(tmp_path / "ws", 2000)
    remove_tree(ws)
    assert not ws.exists()


def test_a_tree_too_deep_to_measure_is_a_clear_refusal(tmp_path: Path) -> None:
    ws = _deep(tmp_path / "ws", tree.MAX_DEPTH + 5)
    with pytest.raises(ToolError, match="nested deeper than"):
        usage(ws)


def test_links_out_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x" * 5000)
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "to-outside").symlink_to(outside, target_is_directory=True)
    (ws / "to-file").symlink_to(outside / "keep.txt")
    assert usage(ws) < 5000  # the links count for themselves
    tree.chown_all(ws, os.getuid(), os.getgid())
    remove_tree(ws)
    assert not ws.exists()
    assert (outside / "keep.txt").read_text() == "x" * 5000


def test_fifos_and_a_fifo_behind_a_link_never_block(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "pipe")
    fifo_outside = tmp_path / "outside-pipe"
    os.mkfifo(fifo_outside)
    (ws / "dir-or-pipe").symlink_to(fifo_outside)  # what a swapped directory would leave
    assert usage(ws) >= 0
    tree.chown_all(ws, os.getuid(), os.getgid())
    remove_tree(ws)
    assert not ws.exists() and fifo_outside.exists()


def test_modes_taken_away_do_not_stop_the_removal(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "b" / "f.txt").write_text("x")
    os.chmod(ws / "a" / "b", 0)
    os.chmod(ws / "a", 0)
    os.chmod(ws, 0)
    try:
        assert usage(ws) >= 1
        remove_tree(ws)
        assert not ws.exists()
    finally:
        if ws.exists():
            for p in (ws, ws / "a", ws / "a" / "b"):
                os.chmod(p, 0o700)


def test_removing_what_is_not_there_is_nothing(tmp_path: Path) -> None:
    remove_tree(tmp_path / "never")
    link = tmp_path / "link"
    link.symlink_to(tmp_path, target_is_directory=True)
    remove_tree(link)  # the link goes, not what it points at
    assert not link.is_symlink() and tmp_path.exists()


_SANDBOX_UID = 1_234_567_890
"""A uid no file here has: what the hand-over gives the workspace to (as root, a session's)."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files away")


def _owners(ws: Path) -> dict[str, int]:
    return {str(p.relative_to(ws)): p.lstat().st_uid for p in [ws, *sorted(ws.rglob("*"))]}


def _handed_over_twice(ws: Path) -> int:
    """A tree handed over, then again once the filesystem's clock (which ticks coarsely) has
    passed every ctime in it, the ones the first hand-over's chowns set included: the second
    stamp is newer than all of them, as between two calls a while apart."""
    first = tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID)
    assert first is not None
    latest = max(p.lstat().st_ctime_ns for p in [ws, *ws.rglob("*")])
    while os.stat(ws).st_ctime_ns <= latest:
        os.chown(ws, _SANDBOX_UID, _SANDBOX_UID)
    stamp = tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID, unchanged_before=first)
    assert stamp is not None and stamp > latest
    return stamp


@needs_root
def test_a_later_hand_over_finds_everything_that_came_in_since(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    for d in ("old/a", "old/b", "untouched/c"):
        (ws / d).mkdir(parents=True)
    (ws / "old" / "a" / "mine.txt").write_text("x")
    stamp = _handed_over_twice(ws)
    # What tether (root) writes into the workspace between two calls, as its file tools do.
    (ws / "old" / "a" / "new.txt").write_text("x")  # a new file in an old directory
    (ws / "old" / "b" / "deep" / "er").mkdir(parents=True)  # new directories in one
    (ws / "old" / "b" / "deep" / "er" / "f.txt").write_text("x")
    (tmp_path / "outside.txt").write_text("x")
    os.rename(tmp_path / "outside.txt", ws / "untouched" / "c" / "moved-in.txt")
    # What sandboxed code may do meanwhile: put a directory's mtime back (its ctime moves on).
    os.utime(ws / "old" / "a", ns=(0, 0))
    assert tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID, unchanged_before=stamp) is not None
    assert set(_owners(ws).values()) == {_SANDBOX_UID}


@needs_root
def test_a_later_hand_over_looks_only_into_directories_that_changed(tmp_path: Path) -> None:
    """Why the stamp is there: in a directory no entry came into, the files are not looked
    at. (Taking a file back to root is something only root does, tether never; it stands in
    here for what the walk would have had to find.)"""
    ws = tmp_path / "ws"
    (ws / "quiet" / "deeper").mkdir(parents=True)
    (ws / "quiet" / "f.txt").write_text("x")
    (ws / "quiet" / "deeper" / "g.txt").write_text("x")
    stamp = _handed_over_twice(ws)
    for f in ("quiet/f.txt", "quiet/deeper/g.txt"):
        os.chown(ws / f, 0, 0)  # the file's ctime moves, not its directory's
    (ws / "top.txt").write_text("x")  # the root itself is always looked into
    tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID, unchanged_before=stamp)
    owners = _owners(ws)
    assert owners["quiet/f.txt"] == owners["quiet/deeper/g.txt"] == 0
    assert owners["top.txt"] == owners["quiet/deeper"] == _SANDBOX_UID
    # Without a stamp (a process that has none) the whole tree is walked.
    tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID)
    assert set(_owners(ws).values()) == {_SANDBOX_UID}


@needs_root
def test_a_hand_over_that_stopped_too_deep_gives_no_stamp(tmp_path: Path) -> None:
    ws = _deep(tmp_path / "ws", tree.MAX_DEPTH + 5)
    assert tree.chown_all(ws, _SANDBOX_UID, _SANDBOX_UID) is None
