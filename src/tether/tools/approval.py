"""Human approval of tool calls, as an in-process callback (``Runtime(approver=...)``).

Approvals are Decisions in the store (DESIGN §7); an approver is one way for an in-process
caller to make them. It fails closed: False, an error or no answer all refuse.
"""

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
EXPIRED_RESULT = "Tool call refused: it requires approval and nobody decided before the deadline."
