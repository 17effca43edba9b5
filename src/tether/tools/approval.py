"""Human approval of tool calls. It fails closed: no approver, an error or a timeout all refuse."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tether.records import SessionKey


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    session: SessionKey
    turn_id: str
    call_id: str
    tool_name: str
    arguments: str


Approver = Callable[[ApprovalRequest], Awaitable[bool]]
"""Decides one call; ``True`` runs it. Anything else — False, an exception, a timeout — refuses."""

REFUSED_RESULT = "Tool call refused: it requires approval and was not approved."
