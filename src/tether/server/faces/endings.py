"""What a protocol face tells its client when a turn did not simply complete.

The MCP and AG-UI faces have no word of their own for "failed", "cancelled" or "waiting for a
human"; each says it in its own error form with the words made here, so the two say the same
thing, and never present such a turn as an answer (DESIGN §1.5).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tether.errors import TetherError
from tether.events import TURN_QUEUED
from tether.records import Event, Turn
from tether.server.problems import Problem, from_error, problem_response
from tether.server.routes.outcomes import failed_status
from tether.server.schemas import DecisionOut
from tether.server.state import ServerState


def ended_code(turn: Turn) -> str:
    """A stable code for an ended, non-completed turn: its status, or ``model_error`` /
    ``server_stopped`` for the failures a client may retry."""
    if turn.status == "failed":
        status, _, _ = failed_status(turn)
        return {502: "model_error", 503: "server_stopped"}.get(status, "failed")
    return turn.status


def ended_message(turn: Turn) -> str:
    """What happened to an ended turn that did not complete, in a sentence of ours."""
    what = {
        "cancelled": "was cancelled",
        "interrupted": "was interrupted by a newer turn",
        "rolled_back": "was rolled back by a newer turn",
        "limit_reached": "stopped at a limit",
        "failed": "failed",
    }.get(turn.status, f"ended {turn.status}")
    text = f"turn {turn.id} {what} ({turn.reason})"
    # ``error`` is ours too: a reason code and a short message, never a provider's raw text.
    return f"{text}: {turn.error}" if turn.error else text


@dataclass(frozen=True)
class Waiting:
    """A turn that waits for a human: what it waits for, and how to answer."""

    turn_id: str
    """The turn whose decisions are pending: this one, or (``behind``) the one it queues behind."""
    behind: str | None
    decisions: list[dict[str, Any]]
    message: str


async def waiting(st: ServerState, turn: Turn, *, withdrawn: bool = False) -> Waiting:
    """What ``turn`` (not ended: awaiting input, or queued behind a turn that is) waits for;
    ``withdrawn``: the turn was queued behind one that waits, and has been cancelled since (the
    message says it was not sent)."""
    scheduler = st.runtime.scheduler
    ahead = await scheduler.parked_ahead(turn)
    waits_on = ahead.id if ahead is not None else turn.id
    pending = await scheduler.decisions(turn.key, turn_id=waits_on, status="pending")
    sid = turn.key.session_id
    asks = "; ".join(_asks(d.payload) for d in pending) or "a decision"
    where = f"/v1/sessions/{sid}/turns/{waits_on}"
    how = (
        f"Decide it through tether's API: POST {where}/decisions with "
        '{"call_id": ..., "decision": "approve"|"deny"|"always"} or {"call_id": ..., "answer": ...}'
    )
    if withdrawn:
        message = (
            f"session {sid} is waiting for a human decision on turn {waits_on} ({asks}), so "
            f"this message was not sent (its turn {turn.id} was withdrawn). {how}; then follow "
            f"GET {where} (or its /events) to the reply, and send the message again."
        )
    else:
        message = (
            f"turn {turn.id} of session {sid} is waiting for a human decision ({asks})"
            + (f", behind turn {waits_on} of the same session" if ahead is not None else "")
            + f". {how}; then follow GET /v1/sessions/{sid}/turns/{turn.id} (or its /events)"
            " to the reply."
        )
    decisions = [DecisionOut.of(d).model_dump(mode="json") for d in pending]
    return Waiting(waits_on, ahead.id if ahead is not None else None, decisions, message)


async def withdrawn_if_behind(st: ServerState, turn: Turn) -> Waiting | None:
    """When ``turn`` waits in the queue behind a turn that waits for a human: withdrawn
    (cancelled, ``caller_cancelled``: nothing of it ran), and what the session waits for. A
    door that answers "not done, decide first" must mean that nothing was done: the message
    left queued would run once the decision is made, after its caller was told it failed (and
    each retry would queue one more). None when it does not wait so."""
    if turn.ended or turn.status != "queued":
        return None
    scheduler = st.runtime.scheduler
    if await scheduler.parked_ahead(turn) is None:
        return None
    wait = await waiting(st, turn, withdrawn=True)
    await scheduler.cancel(turn.key, turn.id, "caller_cancelled")
    return wait


async def unless_behind_a_human(
    st: ServerState, turn: Turn, events: AsyncIterator[Event]
) -> AsyncIterator[Event | Waiting]:
    """``events`` of ``turn``, as they come; but should the turn, still queued, find itself
    behind a turn that waits for a human (one ahead may park while it waits), it is withdrawn
    (:func:`withdrawn_if_behind`) and the stream ends with what the session waits for, rather
    than hang until the decision or its deadline."""
    if turn.status != "queued":
        async for event in events:
            yield event
        return
    scheduler = st.runtime.scheduler
    watch: asyncio.Future[Turn] | None = asyncio.ensure_future(
        scheduler.wait(turn.key, turn.id, until_input=True)
    )
    following: asyncio.Future[Event] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(events))
            while watch is not None and not following.done():
                either: set[asyncio.Future[Any]] = {following, watch}
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if not watch.done():
                    break
                seen, watch = watch, None
                if seen.cancelled() or seen.exception() is not None:
                    break  # the turn's own events say what became of it
                wait = await withdrawn_if_behind(st, seen.result())
                if wait is not None:
                    yield wait
                    return
            try:
                event = await following
            except StopAsyncIteration:
                return
            following = None
            if watch is not None and event.type != TURN_QUEUED:
                watch.cancel()  # it started (or ended): nothing ahead holds it any more
                watch = None
            yield event
    finally:
        for pending in (watch, following):
            if pending is not None:
                pending.cancel()


def _asks(payload: dict[str, Any]) -> str:
    if "question" in payload:
        return f"question: {payload['question']}"
    if "tool" in payload:
        return f"approve tool {payload['tool']}"
    if "steps" in payload:
        return f"go on for {payload['steps']} more steps"
    return "a decision"


@dataclass(frozen=True)
class Refusal:
    """tether's answer to a refused request, for a face to restate in its own form."""

    status: int
    code: str
    """The problem type's last segment, snake-cased (``queue_full``, ``unauthorized``…)."""
    message: str
    headers: dict[str, str]
    """What the caller must see whatever the form: ``WWW-Authenticate``, ``Retry-After``."""


def refusal(exc: TetherError | Problem) -> Refusal:
    """What tether's own API would answer for ``exc`` (its status, reason and detail: the same
    words at every door, and never an exception's raw text)."""
    if isinstance(exc, TetherError):
        answer = from_error(exc)
    else:
        answer = problem_response(
            exc.status, exc.kind, exc.title, exc.detail, headers=exc.headers, **exc.extra
        )
    body = json.loads(bytes(answer.body))
    code = str(body.get("type", "")).rsplit("/", 1)[-1].replace("-", "_") or "error"
    kept = {
        k: v for k, v in answer.headers.items() if k.lower() in ("www-authenticate", "retry-after")
    }
    return Refusal(answer.status_code, code, str(body.get("detail") or body.get("title")), kept)
