"""A small real tmpfs for disk-full tests, and a filler file that takes every free block.

Mounting needs root (or CAP_SYS_ADMIN) on Linux; elsewhere the tests that use it skip and say
how to run them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HOW = (
    "needs a real tmpfs: run as root (or with CAP_SYS_ADMIN) on Linux, where "
    "`mount -t tmpfs -o size=8m tmpfs DIR` works, e.g. `sudo .venv/bin/python -m pytest {}`"
)


@contextlib.contextmanager
def small_tmpfs(where: Path, size_mb: int, test_file: str) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MB mounted at ``where/mnt`` (the test skips when mounting is not
    allowed here); unmounted at the end."""
    test_file = os.path.relpath(test_file)
    if not sys.platform.startswith("linux") or shutil.which("mount") is None:
        pytest.skip(HOW.format(test_file))
    mnt = where / "mnt"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(HOW.format(test_file) + f" (mount said: {done.stderr.decode().strip()})")
    try:
        yield mnt
    finally:
        # Lazy: a process that still holds a file there does not keep the mount busy.
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path) -> Path:
    """A file in ``folder`` that takes every block left (written unbuffered, so closing it
    has nothing left to flush)."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * chunk)
    finally:
        os.close(fd)
    return filler


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize
