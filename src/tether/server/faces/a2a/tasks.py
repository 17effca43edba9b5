"""A tether turn as an A2A task: its id, its state and what the state says.

A task is one turn; its ``contextId`` is the turn's session. The task id is
``<session id>/<turn id>``: a ``GetTask`` or ``CancelTask`` names nothing but the task, and the
session in it is what finds the turn in the caller's own namespace (a session id never holds
``/``, a turn id neither). The states, honestly:

================================  ==========================================================
turn                              task
================================  ==========================================================
queued                            ``submitted`` (the message says when it waits behind a task
                                  that is ``input-required``)
running                           ``working``
awaiting_input                    ``input-required``: the message says what is asked
completed                         ``completed``: the reply is the ``reply`` artifact and the
                                  status message
cancelled, interrupted,           ``canceled``, with the reason in the message
rolled_back
failed, limit_reached             ``failed``, with the reason (and the error) in the message
refused (policy reject, a full    ``rejected``: nothing was stored, so the task cannot be
queue, a bound, shutting down)    read back
================================  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.timestamp_pb2 import Timestamp

from tether.records import Decision, SessionKey, Turn, new_turn_id

S = pb.TaskState
REPLY = "reply"
"""The id of the artifact that holds the agent's reply."""

_STATES: dict[str, pb.TaskState] = {
    "queued": S.TASK_STATE_SUBMITTED,
    "running": S.TASK_STATE_WORKING,
    "awaiting_input": S.TASK_STATE_INPUT_REQUIRED,
    "completed": S.TASK_STATE_COMPLETED,
    "cancelled": S.TASK_STATE_CANCELED,
    "interrupted": S.TASK_STATE_CANCELED,
    "rolled_back": S.TASK_STATE_CANCELED,
    "failed": S.TASK_STATE_FAILED,
    "limit_reached": S.TASK_STATE_FAILED,
}
ENDED = frozenset(
    {S.TASK_STATE_COMPLETED, S.TASK_STATE_CANCELED, S.TASK_STATE_FAILED, S.TASK_STATE_REJECTED}
)

APPROVAL_VERDICTS = ("approve", "deny", "always")
QUESTION_VERDICTS = ("answer", "deny")


def task_id(key: SessionKey, turn_id: str) -> str:
    return f"{key.session_id}/{turn_id}"


def split_task_id(value: str) -> tuple[str, str] | None:
    """(session id, turn id) of a task id this face minted; None for anything else."""
    session_id, sep, turn_id = value.rpartition("/")
    return (session_id, turn_id) if sep and session_id and turn_id else None


def task_of(
    turn: Turn,
    pending: Sequence[Decision] = (),
    behind: Turn | None = None,
    *,
    history: int | None = None,
) -> pb.Task:
    """The task a turn is; ``pending`` its open decisions (when it is awaiting input),
    ``behind`` the turn awaiting input it is queued behind, ``history`` how many of its
    messages to keep (None: all)."""
    tid = task_id(turn.key, turn.id)
    sid = turn.key.session_id
    task = pb.Task(id=tid, context_id=sid, status=status_of(turn, pending, behind))
    if turn.status == "completed" and turn.output:
        task.artifacts.append(reply_artifact(turn.output))
    messages = [_message(turn, "input", pb.Role.ROLE_USER, turn.input)]
    keep = len(messages) if history is None else max(0, history)
    task.history.extend(messages[len(messages) - keep :] if keep else [])
    task.metadata.update(_metadata(turn))
    return task


def status_of(
    turn: Turn,
    pending: Sequence[Decision] = (),
    behind: Turn | None = None,
    *,
    at: float | None = None,
) -> pb.TaskStatus:
    """The task's status for the turn as it stands (``at``: when it came to be so)."""
    state = _STATES.get(turn.status, S.TASK_STATE_UNSPECIFIED)
    status = pb.TaskStatus(state=state)
    when = at or turn.ended_at or turn.started_at or turn.created_at
    status.timestamp.CopyFrom(_timestamp(when))
    text = _status_text(turn, pending, behind)
    if text is not None:
        message = _message(turn, f"status-{turn.status}", pb.Role.ROLE_AGENT, text)
        if pending and turn.status == "awaiting_input":
            message.parts.add().data.struct_value.update({"decisions": asked(pending)})
        status.message.CopyFrom(message)
    return status


def rejected(key: SessionKey, reason: str) -> pb.Task:
    """The task a refused message would have been: ``rejected``, with why. Nothing was
    stored, so its id names no turn (reading it back is TaskNotFound)."""
    tid = task_id(key, new_turn_id())
    message = pb.Message(
        message_id=f"{tid}:rejected",
        context_id=key.session_id,
        task_id=tid,
        role=pb.Role.ROLE_AGENT,
        parts=[pb.Part(text=reason)],
    )
    status = pb.TaskStatus(state=S.TASK_STATE_REJECTED, message=message)
    return pb.Task(id=tid, context_id=key.session_id, status=status)


def reply_artifact(text: str) -> pb.Artifact:
    return pb.Artifact(artifact_id=REPLY, name=REPLY, parts=[pb.Part(text=text)])


def _status_text(turn: Turn, pending: Sequence[Decision], behind: Turn | None) -> str | None:
    status, reason = turn.status, turn.reason
    if status == "queued":
        if behind is None:
            return None
        return (
            f"waiting behind task {task_id(behind.key, behind.id)}, which is input-required: "
            "answer it first"
        )
    if status == "running":
        return None
    if status == "awaiting_input":
        return "\n".join(ask(d) for d in pending) or "waiting for a human decision"
    if status == "completed":
        return turn.output or ""
    if status in ("cancelled", "interrupted", "rolled_back"):
        said = f"the task was {status.replace('_', ' ')}"
        return said if reason in (None, status) else f"{said} ({reason})"
    if status == "limit_reached":
        return f"the task stopped at a limit ({reason})"
    detail = f"the task failed ({reason})"
    if reason == "model_error":
        detail = "the task failed: the model provider failed"
    return f"{detail}: {turn.error}" if turn.error else detail


def ask(d: Decision) -> str:
    """What a pending decision asks, in words, with the answers it takes."""
    payload = d.payload
    if d.kind == "approval" and "tool" in payload:
        arguments = json.dumps(_arguments(payload), ensure_ascii=False, sort_keys=True)
        return (
            f"Approve the call of tool {payload['tool']} with arguments {arguments}? "
            "Answer approve, deny or always (approve this tool for the rest of the conversation)."
        )
    question = str(payload.get("question", "A decision is needed."))
    if d.kind == "approval":
        return f"{question} Answer approve or deny."
    choices = payload.get("choices")
    if choices:
        return f"{question} Answer one of: {', '.join(map(str, choices))} (or deny)."
    return f"{question} Answer in words (or deny)."


def asked(pending: Sequence[Decision]) -> list[dict[str, Any]]:
    """The pending decisions as data: what a client needs to answer one."""
    out: list[dict[str, Any]] = []
    for d in pending:
        item: dict[str, Any] = {"callId": d.call_id, "kind": d.kind, "deadline": d.deadline}
        if d.kind == "approval" and "tool" in d.payload:
            item["tool"] = d.payload["tool"]
            item["arguments"] = _arguments(d.payload)
            item["verdicts"] = list(APPROVAL_VERDICTS)
        elif d.kind == "approval":
            item["question"] = d.payload.get("question")
            item["verdicts"] = ["approve", "deny"]
        else:
            item["question"] = d.payload.get("question")
            item["verdicts"] = list(QUESTION_VERDICTS)
            if d.payload.get("choices"):
                item["choices"] = list(d.payload["choices"])
        out.append(item)
    return out


def _arguments(payload: dict[str, Any]) -> Any:
    """A call's arguments as data: the model's JSON text is parsed (kept as text if it is not
    JSON, so the human sees exactly what the model asked)."""
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _message(turn: Turn, suffix: str, role: pb.Role, text: str) -> pb.Message:
    tid = task_id(turn.key, turn.id)
    return pb.Message(
        message_id=f"{tid}:{suffix}",
        context_id=turn.key.session_id,
        task_id=tid,
        role=role,
        parts=[pb.Part(text=text)],
    )


def _metadata(turn: Turn) -> dict[str, Any]:
    """tether's own words for the turn, for a client that wants them (and for logs)."""
    tether: dict[str, Any] = {"turnId": turn.id, "status": turn.status, "agent": turn.agent_name}
    if turn.reason:
        tether["reason"] = turn.reason
    return {"tether": tether}


def _timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp
