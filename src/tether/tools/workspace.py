"""Where a session's workspace lives: a directory named by a hash of the session's key.

Names never become path parts. Session ids ``.`` and ``..`` are valid, and tenant and user
names may hold ``/`` or ``..``: built from the raw names, the workspace of session ``..`` would
be its owner's tenant directory, holding every other user's workspaces. A hash of the whole key
cannot name anything but its own directory, and is the same in every process.

Layout: ``<root>/<hash of tenant, owner>/<hash of tenant, owner, session_id>``, so all of one
user's workspaces sit in one directory (forgetting a user removes it whole).

Lifecycle: made on first use (by the tool that writes), held to a quota, and removed with its
session: deleted, expired (the sweep, and a read that finds it expired), cleared with
``workspace=True``, or its user forgotten. The root is ``<data dir>/workspaces`` of the
process (:func:`root_for`): on PostgreSQL with several machines, a workspace is node-local
scratch (a session's turns may run on any node, each with its own copy) unless every node sets
``TETHER_WORKSPACE_ROOT`` to one shared path; a session removed through one node removes that
node's copy only.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from tether.errors import ConfigError, ToolError
from tether.records import SessionKey
from tether.tools import tree

log = logging.getLogger("tether.workspace")

_DIGEST_CHARS = 32
"""128 bits of SHA-256: no two sessions share a directory by accident."""


def _digest(*parts: str) -> str:
    # JSON keeps the parts apart: ("a/b", "c") and ("a", "b/c") are different keys; ASCII
    # escapes make any string encodable.
    encoded = json.dumps(parts).encode("ascii")
    return hashlib.sha256(encoded).hexdigest()[:_DIGEST_CHARS]


def owner_workspaces(root: Path, tenant: str, owner: str) -> Path:
    """The directory that holds every workspace of one user."""
    return root / _digest(tenant, owner)


@functools.lru_cache(maxsize=1024)
def workspace_dir(root: Path, key: SessionKey) -> Path:
    """The workspace of the session ``key`` under ``root`` (not created here). Remembered for
    the sessions of the latest turns: every turn asks, and two digests cost ~8 µs."""
    return owner_workspaces(root, key.tenant, key.owner) / _digest(
        key.tenant, key.owner, key.session_id
    )


ROOT_ENV = "TETHER_WORKSPACE_ROOT"


def root_for(data_dir: Path) -> Path:
    """Where workspaces live: ``TETHER_WORKSPACE_ROOT`` (a path every node shares, say), else
    ``<data dir>/workspaces``."""
    shared = os.environ.get(ROOT_ENV, "").strip()
    return Path(shared) if shared else data_dir / "workspaces"


DEFAULT_QUOTA_BYTES = 100 * 1024 * 1024
"""What one session's workspace may hold (files written by its tools and its sandbox)."""
QUOTA_ENV = "TETHER_WORKSPACE_QUOTA_MB"


def quota_from_env() -> int:
    """``TETHER_WORKSPACE_QUOTA_MB`` in bytes (the default when unset); ConfigError otherwise."""
    raw = os.environ.get(QUOTA_ENV, "").strip()
    if not raw:
        return DEFAULT_QUOTA_BYTES
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not mb > 0:
        raise ConfigError(f"{QUOTA_ENV} must be a positive number of megabytes, not {raw!r}")
    return int(mb * 1024 * 1024)


def ensure_workspace(path: Path) -> Path:
    """Make the workspace (and the user's directory above it), readable by this user only."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def usage(path: Path) -> int:
    """Bytes held by the workspace's files (0 when it does not exist). Symlinks are not
    followed: a link counts for itself, never for what it points at (:mod:`.tree`, which the
    sandbox cannot lead astray). ToolError for a tree too deep to measure."""
    try:
        return tree.size(path)
    except tree.TooDeep as exc:
        raise ToolError(f"the workspace is {exc}; flatten it to go on writing") from None


def check_quota(path: Path, quota: int, adding: int, replacing: int = 0) -> None:
    """ToolError when writing ``adding`` bytes (in place of ``replacing`` ones) would take the
    workspace past ``quota``."""
    after = usage(path) - replacing + adding
    if after > quota:
        raise ToolError(
            f"the workspace would hold {after:,} bytes, over its quota of {quota:,} bytes; "
            "delete files to make room"
        )


def remove_tree(path: Path) -> None:
    """Delete a workspace (or a user's directory of them) and everything in it, if it exists:
    however deep, whatever its modes, never through a link (:func:`.tree.remove`)."""
    tree.remove(path)


def remove_workspace(root: Path, key: SessionKey) -> None:
    remove_tree(workspace_dir(root, key))


def remove_owner_workspaces(root: Path, tenant: str, owner: str) -> None:
    remove_tree(owner_workspaces(root, tenant, owner))


async def discard(root: Path | None, keys: Iterable[SessionKey]) -> None:
    """Remove the workspaces of sessions that are gone (deleted, expired), off the event loop:
    a big workspace takes a while to delete. Each node removes its own copy; see
    :mod:`tether.tools.workspace` on deployments of several machines."""
    if root is None:
        return
    dirs = [workspace_dir(root, k) for k in keys]

    def remove_all() -> None:
        for d in dirs:
            # One that cannot go (a disk error) must not keep the others: say so, go on.
            try:
                remove_tree(d)
            except OSError:
                log.exception("could not remove the workspace %s", d.name)

    await asyncio.to_thread(remove_all)


async def discard_owner(root: Path | None, tenant: str, owner: str) -> None:
    """Remove every workspace of one user (forget), off the event loop."""
    if root is not None:
        await asyncio.to_thread(remove_tree, owner_workspaces(root, tenant, owner))
