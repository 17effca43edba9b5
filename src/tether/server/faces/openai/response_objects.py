"""The Responses API's view of a turn: a response's id, and the response object itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.records import SESSION_ID_PATTERN, Turn
from tether.server.faces.openai.errors import FaceError
from tether.server.schemas import minted

PREFIX = "resp_"


@dataclass(frozen=True)
class Asked:
    """What the creating request said that its response repeats."""

    model: str | None = None
    previous: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    background: bool | None = None
    """None when read back: the store keeps the turn, not how its request asked for it."""


def response_id(turn: Turn) -> str:
    return f"{PREFIX}{turn.id}.{turn.key.session_id}"


def parse_id(value: str) -> tuple[str, str]:
    """(turn id, session id) of a response id; FaceError 404 when it cannot be one of ours."""
    turn_id, dot, session_id = value.removeprefix(PREFIX).partition(".")
    if not (
        value.startswith(PREFIX)
        and dot
        and minted(turn_id)
        and SESSION_ID_PATTERN.fullmatch(session_id)
    ):
        raise FaceError(404, "no such response", "response_not_found")
    return turn_id, session_id


def status_of(turn: Turn) -> str:
    if turn.status == "queued":
        return "queued"
    if not turn.ended:
        return "in_progress"  # running, or waiting for a human decision
    if turn.status == "completed":
        return "completed" if turn.complete else "incomplete"
    if turn.status == "failed":
        return "failed"
    if turn.status == "limit_reached":
        return "incomplete"
    return "cancelled"


def message_id(turn: Turn, index: int = 0) -> str:
    """The id of the ``index``-th message a turn said (the first is named after the turn)."""
    return f"msg_{turn.id}" if index == 0 else f"msg_{turn.id}_{index}"


def message_item(turn: Turn, text: str, status: str, index: int = 0) -> dict[str, Any]:
    return {
        "type": "message",
        "id": message_id(turn, index),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def response_object(
    turn: Turn, asked: Asked | None = None, said: list[str] | None = None
) -> dict[str, Any]:
    """The Responses API's view of ``turn`` (``asked``: by the request that made it). Ended,
    its output is a ``message`` item for each of the messages it ``said``
    (:func:`~tether.server.faces.openai.said.said`; None: its output alone)."""
    asked = asked or Asked()
    status = status_of(turn)
    usage = turn.usage
    output = []
    texts = said if said is not None else [turn.output] if turn.output else []
    if turn.ended:
        for n, text in enumerate(texts):
            last = n == len(texts) - 1
            state = "incomplete" if last and not turn.complete else "completed"
            output.append(message_item(turn, text, state, n))
    error = None
    if status == "failed":
        error = {"code": "server_error", "message": f"{turn.reason}: {turn.error or ''}".strip()}
    incomplete = None
    if status == "incomplete":
        limit = turn.status == "limit_reached" or turn.reason == "finished_at_limit"
        incomplete = {"reason": "max_messages" if limit else "max_output_tokens"}
    return {
        "id": response_id(turn),
        "object": "response",
        "created_at": turn.created_at,
        "completed_at": turn.ended_at if status == "completed" else None,
        "status": status,
        "background": asked.background,
        "model": asked.model or turn.agent_name,
        "output": output,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": None,
        "metadata": asked.metadata,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "previous_response_id": asked.previous,
        "conversation": {"id": turn.key.session_id},
        "usage": {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        },
    }
