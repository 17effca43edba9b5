"""Ids: the session id rule (validated, never rewritten) and the unguessable ids tether mints."""

from __future__ import annotations

import re
import secrets

from tether.errors import InvalidSessionId

SESSION_ID_PATTERN = re.compile(r"(?!\.+\Z)[A-Za-z0-9._:-]{1,128}")
"""Not dots alone: ``.`` and ``..`` are no path segment a URL keeps (HTTP clients and browsers
resolve ``/v1/sessions/..`` to ``/v1``), so such a session could be made and never reached."""


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged, or raise: ids are never silently rewritten."""
    if not isinstance(session_id, str) or SESSION_ID_PATTERN.fullmatch(session_id) is None:
        raise InvalidSessionId(
            "session_id must be 1-128 characters of letters, digits and '._:-', not dots alone"
        )
    return session_id


def new_session_id() -> str:
    """An unguessable id (128 random bits) in the session id alphabet."""
    return "s_" + secrets.token_urlsafe(16)


def new_turn_id() -> str:
    return "t_" + secrets.token_urlsafe(12)


def new_call_id() -> str:
    return "call_" + secrets.token_urlsafe(9)


def new_memory_id() -> str:
    return "mem_" + secrets.token_urlsafe(12)


def new_document_id() -> str:
    return "doc_" + secrets.token_urlsafe(12)
