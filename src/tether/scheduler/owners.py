"""Who holds a session: owner ids that let a process on the same host tell a dead owner."""

from __future__ import annotations

import os
import secrets
import socket

_HOST = socket.gethostname()


def new_owner_id(node: str | None = None) -> str:
    """``node|host|pid|nonce``: host and pid let a process on the same machine tell a dead owner."""
    return f"{node or 'node'}|{_HOST}|{os.getpid()}|{secrets.token_hex(4)}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` was a process on this host that no longer exists."""
    parts = owner.split("|")
    if len(parts) != 4 or parts[1] != _HOST:
        return False
    try:
        pid = int(parts[2])
    except ValueError:
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
