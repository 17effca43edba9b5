"""HTTP status mirrors a turn's outcome: only a completed turn is a plain success."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from tether.records import Turn
from tether.server.problems import problem_response
from tether.server.schemas import TurnOut

# status of a non-completed turn → (HTTP status, problem type, title)
_OUTCOMES: dict[str, tuple[int, str, str]] = {
    "cancelled": (409, "turn-cancelled", "Turn cancelled"),
    "interrupted": (409, "turn-interrupted", "Turn interrupted"),
    "rolled_back": (409, "turn-rolled-back", "Turn rolled back"),
    "limit_reached": (422, "turn-limit-reached", "Turn limit reached"),
}


def _stopped_by_server(turn: Turn) -> bool:
    return turn.reason in ("owner_lost", "lease_lost", "shutdown")


def failed_status(turn: Turn) -> tuple[int, str, str]:
    if turn.reason == "model_error":
        return 502, "turn-failed", "Turn failed: the model provider failed"
    if _stopped_by_server(turn):
        return 503, "turn-failed", "Turn failed: the server running it stopped"
    return 500, "turn-failed", "Turn failed"


def turn_problem(turn: Turn, **extra: Any) -> JSONResponse:
    if turn.status == "failed":
        status, kind, title = failed_status(turn)
    elif turn.status == "cancelled" and _stopped_by_server(turn):
        # Not the client's doing: the server shut down under it. Retry elsewhere or later.
        status, kind, title = 503, "turn-cancelled", "Turn cancelled: the server shut down"
    else:
        status, kind, title = _OUTCOMES.get(turn.status, (500, "turn-failed", "Turn failed"))
    detail = f"the turn ended {turn.status} ({turn.reason})"
    if turn.error:
        detail += f": {turn.error}"
    return problem_response(
        status, kind, title, detail, turn=TurnOut.of(turn).model_dump(mode="json"), **extra
    )


def turn_response(turn: Turn) -> JSONResponse:
    if turn.status == "completed":
        return JSONResponse(TurnOut.of(turn).model_dump(mode="json"))
    return turn_problem(turn)
