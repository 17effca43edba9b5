"""Credentials out of what tether logs and prints: URLs and provider texts may carry them.

``http://user:secret@host`` and ``http://token@host`` carry credentials in the user info, and
``?api_key=…`` (or ``key``, ``token``, ``access_token``, ``password``…) in the query. Both are
masked wherever they appear in a text: a URL in an error message, a log line, a banner.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?<=//)[^/@\s]+@")
_QUERY_SECRET = re.compile(
    r"(?<=[?&;])((?:api[_-]?key|key|token|access[_-]?token|auth|password|passwd|pwd|secret)=)"
    r"[^&#\s]*",
    re.I,
)


def redact_url(text: str) -> str:
    """``text`` with the user info of every URL and credential query values masked."""
    return _QUERY_SECRET.sub(r"\1***", _USERINFO.sub("***@", text))
