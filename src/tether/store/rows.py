"""Record shapes shared by every store backend."""

from __future__ import annotations

from typing import Any

from tether.records import TurnEnding


def terminal_event_data(turn_id: str, ending: TurnEnding) -> dict[str, Any]:
    """The body of a ``turn.ended`` event; one shape for every writer of it."""
    return {
        "turn_id": turn_id,
        "status": ending.status,
        "reason": ending.reason,
        "output": ending.output,
        "complete": ending.complete,
        "error": ending.error,
        "usage": {
            "input_tokens": ending.usage.input_tokens,
            "output_tokens": ending.usage.output_tokens,
            "model_calls": ending.usage.model_calls,
        },
    }
