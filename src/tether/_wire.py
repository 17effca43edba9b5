"""A tether server's JSON as records, and what a client does with a decision a turn asks.

The sync and async clients (:mod:`tether.client`) are twins over these I/O-free pieces:
request bodies and paths, the SSE parser, problems as errors, answers as records.

Records rebuilt from the wire carry a :class:`SessionKey` whose ``tenant`` and ``owner`` are
empty (:data:`UNKNOWN`): the server knows whose session it is from the caller's credentials,
the client only knows the session id. Such a key names the session for the same client again
(``Client.decide``, ``Session.decide``); it is not a key for a local store.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from tether.errors import (
    AgentNotFound,
    DecisionMade,
    DecisionRequired,
    NotFound,
    RemoteConflict,
    RemoteError,
    RemoteForbidden,
    RemoteInvalidInput,
    RemoteLimitExceeded,
    RemoteModelError,
    RemoteTooLarge,
    RemoteUnauthorized,
    RemoteUnavailable,
    SessionBusy,
    TurnFailed,
)
from tether.events import DECISION_REQUESTED
from tether.records import (
    TERMINAL_STATUSES,
    AgentRef,
    Decision,
    DecisionKind,
    DecisionStatus,
    Policy,
    SessionKey,
    Turn,
    TurnStatus,
    Usage,
    Verdict,
    check_submission,
)
from tether.runtime import DecisionAnswer, OnDecision, verdict_of

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("tether.client")

UNKNOWN = ""
"""Tenant and owner of a key rebuilt from the wire: the client does not know them."""
AWAITING_INPUT = "awaiting_input"


def remote_key(session_id: str) -> SessionKey:
    # Not SessionKey.of: the server validated the id, and the principal is not ours to name.
    return SessionKey(UNKNOWN, UNKNOWN, session_id)


def decision_of(session_id: str, data: dict[str, Any]) -> Decision:
    """A decision as the server shows it (``DecisionOut``, ``decision.*`` event data)."""
    return Decision(
        key=remote_key(session_id),
        turn_id=str(data["turn_id"]),
        call_id=str(data["call_id"]),
        kind=cast(DecisionKind, data["kind"]),
        payload=dict(data.get("payload") or {}),
        status=cast(DecisionStatus, data["status"]),
        created_at=float(data["created_at"]),
        deadline=float(data["deadline"]),
        answer=data.get("answer"),
        decided_by=data.get("decided_by"),
        decided_at=data.get("decided_at"),
    )


def turn_of(data: dict[str, Any]) -> Turn:
    """A turn as the server shows it (``TurnOut``). Its agent's fingerprint is not on the
    wire: it is left empty."""
    usage = data.get("usage") or {}
    agent = data.get("agent")
    return Turn(
        id=str(data["id"]),
        key=remote_key(str(data["session_id"])),
        seq=int(data["seq"]),
        input=str(data["input"]),
        policy=cast(Policy, data["policy"]),
        status=cast(TurnStatus, data["status"]),
        reason=data.get("reason"),
        error=data.get("error"),
        output=data.get("output"),
        complete=bool(data.get("complete")),
        usage=Usage(
            int(usage.get("input_tokens", 0)),
            int(usage.get("output_tokens", 0)),
            int(usage.get("model_calls", 0)),
        ),
        created_at=float(data["created_at"]),
        started_at=data.get("started_at"),
        ended_at=data.get("ended_at"),
        agent=AgentRef(str(agent), "") if agent else None,
        ran_by=data.get("ran_by"),
    )


def ended(turn: dict[str, Any]) -> bool:
    return turn.get("status") in TERMINAL_STATUSES


def waiting(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The pending decisions a turn waits for: its own (``awaiting_input``), or, queued
    ``behind`` a turn that waits, that turn's, which the server's answer lists (none for any
    other turn)."""
    status = turn.get("status")
    if status != AWAITING_INPUT and not (status == "queued" and turn.get("behind")):
        return []
    return [d for d in turn.get("decisions") or [] if d.get("status") == "pending"]


def output_of(turn: dict[str, Any]) -> str:
    """The reply of an ended turn; TurnFailed (with the turn) when it did not complete."""
    if turn.get("status") != "completed":
        raise TurnFailed(turn_of(turn))
    return str(turn.get("output") or "")


def decision_body(call_id: str, verdict: Verdict, answer: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"call_id": call_id, "decision": verdict}
    if answer is not None:
        body["answer"] = answer
    return body


def session_of_path(path: str) -> str:
    """The session id of a ``/v1/sessions/{sid}/…`` path ('' for other paths)."""
    parts = path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v1", "sessions"] else ""


# -- requests and answers ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RemoteEvent:
    id: str
    type: str
    data: dict[str, Any]

    @property
    def seq(self) -> int:
        """The event's place in its turn (the ``<turn>:<seq>`` id's tail; 0 if it has none)."""
        tail = self.id.rpartition(":")[2]
        return int(tail) if tail.isdigit() else 0


def raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text[:200]}
    if not isinstance(body, dict):
        body = {"detail": str(body)[:200]}
    detail = str(body.get("detail", response.reason_phrase))
    if response.status_code == 404:
        if isinstance(body.get("agents"), list):  # only an unknown agent's 404 lists them
            raise AgentNotFound(detail, known=[str(a) for a in body["agents"]])
        raise NotFound(detail)
    if response.status_code == 409 and body.get("busy_turn_id"):
        raise SessionBusy(detail, busy_turn_id=str(body["busy_turn_id"]))
    if response.status_code == 409 and isinstance(body.get("decision"), dict):
        sid = session_of_path(response.request.url.path)
        raise DecisionMade(detail, decision=decision_of(sid, body["decision"]))
    kind = str(body.get("type", ""))
    if response.status_code == 401:
        detail = (
            f"{detail}: this server wants a valid API key or token (Python: "
            "Session(api_key=…) or headers=; the CLI: --key or TETHER_API_KEY)"
        )
    error = remote_error(kind.rpartition("/")[2])(response.status_code, kind, detail, body)
    if isinstance(error, RemoteLimitExceeded):
        retry = response.headers.get("Retry-After", "")
        error.retry_after = float(retry) if retry.isdigit() else error.retry_after
    raise error


# The problem types a client has a class for (the last part of a problem's ``type``).
_PROBLEM_ERRORS: dict[str, type[RemoteError]] = {
    "unauthorized": RemoteUnauthorized,
    "forbidden": RemoteForbidden,
    "conflict": RemoteConflict,
    "idempotency-key-reused": RemoteInvalidInput,
    "invalid-input": RemoteInvalidInput,
    "malformed-json": RemoteInvalidInput,
    "validation": RemoteInvalidInput,
    "turn-limit-reached": RemoteInvalidInput,
    "limit-exceeded": RemoteLimitExceeded,
    "queue-full": RemoteLimitExceeded,
    "too-large": RemoteTooLarge,
    "storage-quota": RemoteTooLarge,
    "model-error": RemoteModelError,
    "store-unavailable": RemoteUnavailable,
    "shutting-down": RemoteUnavailable,
}


def remote_error(kind: str) -> type[RemoteError]:
    """The RemoteError subclass for a problem ``kind``; an unknown kind is a plain one."""
    return _PROBLEM_ERRORS.get(kind, RemoteError)


def headers(api_key: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    out = dict(extra or {})
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def chat_body(message: str, session_id: str | None, agent_name: str | None) -> dict[str, Any]:
    check_submission(message)  # before the round trip, as an embedded session checks it
    body: dict[str, Any] = {"message": message}
    if session_id:
        body["session_id"] = session_id
    if agent_name:
        body["agent_name"] = agent_name
    return body


def idempotency(key: str | None) -> dict[str, str] | None:
    """The headers that carry an idempotency key, when there is one."""
    check_submission("", idempotency_key=key)  # text, as an embedded session checks it
    return {"Idempotency-Key": key} if key else None


def stream_body(message: str, policy: str) -> dict[str, Any]:
    check_submission(message, policy)
    # Closing the stream early cancels the turn: a terminal user pressing Ctrl-C means it.
    return {"input": message, "stream": True, "policy": policy, "on_disconnect": "cancel"}


def turn_path(session_id: str, turn_id: str) -> str:
    return f"/v1/sessions/{session_id}/turns/{turn_id}"


def decisions_path(session_id: str, turn_id: str | None) -> str:
    if turn_id:
        return f"{turn_path(session_id, turn_id)}/decisions"
    return f"/v1/sessions/{session_id}/decisions"


def decisions_of(
    session_id: str, listed: dict[str, Any], status: DecisionStatus | None
) -> list[Decision]:
    found = [decision_of(session_id, d) for d in listed["decisions"]]
    return [d for d in found if status is None or d.status == status]


def asks(event: RemoteEvent) -> bool:
    return event.type == DECISION_REQUESTED and event.data.get("status") == "pending"


def chat_reply(parked: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
    """``/api/chat``'s answer for a turn that waited for a decision and has now ended."""
    return {
        "response": output_of(turn),
        "agent_name": parked["agent_name"],
        "session_id": parked["session_id"],
        "turn_id": turn.get("id"),
    }


class SSEParser:
    """Incremental: feed lines, get an event at each blank line (sync and async share it)."""

    def __init__(self) -> None:
        self._id, self._type, self._data = "", "message", list[str]()

    def feed(self, line: str) -> RemoteEvent | None:
        if line == "":
            event = None
            if self._data:
                event = RemoteEvent(self._id, self._type, json.loads("\n".join(self._data)))
            self._id, self._type, self._data = "", "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        return None


# -- asking the caller's on_decision -------------------------------------------------------------
def verdict_for(d: Decision, said: DecisionAnswer) -> tuple[Verdict, str | None]:
    """What the callback said as a verdict (as :func:`tether.runtime.verdict_of`);
    DecisionRequired when it cannot decide (None)."""
    verdict = verdict_of(d, said)
    if verdict is None:
        raise DecisionRequired(d)
    return verdict


def ask(on_decision: OnDecision | None, d: Decision) -> tuple[Verdict, str | None]:
    """Ask a blocking caller. A callback that raises refuses: it fails closed."""
    if on_decision is None:
        raise DecisionRequired(d)
    try:
        said = on_decision(d)
        if inspect.isawaitable(said):
            said = asyncio.run(_awaited(said))
    except Exception:
        log.warning("on_decision raised for %s; refusing", d.call_id, exc_info=True)
        return "deny", None
    return verdict_for(d, said)


async def aask(on_decision: OnDecision | None, d: Decision) -> tuple[Verdict, str | None]:
    """Ask from an event loop: a sync callback runs on a thread (it may block on input())."""
    if on_decision is None:
        raise DecisionRequired(d)
    try:
        if inspect.iscoroutinefunction(on_decision):
            said = await on_decision(d)
        else:
            said = await asyncio.to_thread(on_decision, d)
            if inspect.isawaitable(said):
                said = await said
    except Exception:
        log.warning("on_decision raised for %s; refusing", d.call_id, exc_info=True)
        return "deny", None
    return verdict_for(d, cast(DecisionAnswer, said))


async def _awaited(said: Awaitable[DecisionAnswer]) -> DecisionAnswer:
    return await said
