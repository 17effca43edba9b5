"""Where a session's workspace lives: a directory named by a hash of the session's key.

Names never become path parts. Session ids ``.`` and ``..`` are valid, and tenant and user
names may hold ``/`` or ``..``: built from the raw names, the workspace of session ``..`` would
be its owner's tenant directory, holding every other user's workspaces. A hash of the whole key
cannot name anything but its own directory, and is the same in every process.

Layout: ``<root>/<hash of tenant, owner>/<hash of tenant, owner, session_id>``, so all of one
user's workspaces sit in one directory (forgetting a user removes it whole).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tether.records import SessionKey

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


def workspace_dir(root: Path, key: SessionKey) -> Path:
    """The workspace of the session ``key`` under ``root`` (not created here)."""
    return owner_workspaces(root, key.tenant, key.owner) / _digest(
        key.tenant, key.owner, key.session_id
    )
