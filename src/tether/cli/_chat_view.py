"""How the chat shows a turn as it runs: streamed text, tool calls and results, its ending."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tether import events

# Cancellations the user asked for need no reason; the others say who ended the turn.
_ASKED = {None, "cancelled", "caller_cancelled", "client_disconnected"}
_CANCELLED_BY = {
    "shutdown": "the server is shutting down",
    "session_expired": "the session expired",
    "session_deleted": "the session was deleted",
    "user_data_deleted": "the user's data was deleted",
}
_LIMITS = {
    "max_iterations": "it made as many model calls as the agent's max_iterations allows",
    "token_budget": "it used up the agent's token_budget",
    "loop": "the model kept repeating the same tool call",
}


def ending(status: object, reason: object, error: object = None) -> str | None:
    """One line for a turn that did not complete (None for one that did)."""
    if status == "completed":
        return None
    if status == "cancelled":
        if reason in _ASKED:
            return "turn cancelled"
        return f"turn cancelled: {_CANCELLED_BY.get(str(reason), str(reason))}"
    if status in ("interrupted", "rolled_back"):
        verb = "interrupted" if status == "interrupted" else "rolled back"
        return f"turn {verb} by a newer message"
    if status == "limit_reached":
        return f"turn stopped: {_LIMITS.get(str(reason), str(reason))}"
    if status == "rejected":
        return "turn rejected: another turn of this session was running"
    return f"turn {status} ({reason})" + (f": {error}" if error else "")


def show_event(out: Console, kind: str, data: dict[str, Any]) -> None:
    # Everything that comes from the model, a tool or the server is printed as plain text:
    # brackets in it are not rich markup (and "[/x]" would otherwise crash the chat).
    if kind == events.MESSAGE_DELTA:
        out.print(data.get("text", ""), end="", markup=False, highlight=False)
    elif kind == events.TOOL_CALL:
        out.print()
        out.print(f"→ {data.get('name')}({data.get('arguments')})", style="yellow", markup=False)
    elif kind == events.TOOL_RESULT:
        text = str(data.get("output", ""))
        out.print(f"← {text[:200]}", style="yellow", markup=False)
    # decision.requested: the chat asks the user (see _chat_decisions), nothing more to show.
    elif kind == events.DECISION_MADE and data.get("status") == "expired":
        out.print("nobody decided in time: refused", style="red", markup=False)
    elif kind == events.TURN_ENDED:
        out.print()
        line = ending(data.get("status"), data.get("reason"), data.get("error"))
        if line:
            out.print(line, style="red", markup=False)
