"""What each A2A method does with tether's sessions, turns and decisions.

A message without ``taskId`` is a new turn: on the session its ``contextId`` names (one the
caller has; any other is refused, never a fresh chat in its place), or on a new session when it
names none. A message with ``taskId`` answers what that task, ``input-required``, asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from tether.errors import (
    DecisionMade,
    DecisionNotFound,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidSessionId,
    LimitExceeded,
    SessionBusy,
    SessionNotFound,
    ShuttingDown,
    TooLarge,
)
from tether.records import POLICIES, VERDICTS, Decision, Policy, Principal, SessionKey, Turn
from tether.records import Verdict as VerdictWord
from tether.server.conversation import as_taken, open_session, send, submit
from tether.server.faces.a2a import tasks
from tether.server.faces.a2a.wire import error
from tether.server.schemas import minted
from tether.server.state import ServerState

_IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,255}")
CANCEL_WAIT = 30.0
"""Seconds a CancelTask waits for a running turn to stop (as the native cancel route)."""


@dataclass(frozen=True)
class Begun:
    """What a message set going: a turn to follow after its event ``after``, or the
    ``rejected`` task a refusal is."""

    turn: Turn | None = None
    after: int = 0
    refused: pb.Task | None = None


async def begin(
    st: ServerState, caller: Principal, agent: str, params: pb.SendMessageRequest
) -> Begun:
    if not params.HasField("message"):
        raise error(InvalidParamsError, "params.message is required")
    message = params.message
    if message.role != pb.Role.ROLE_USER:
        raise error(InvalidParamsError, "the message's role must be ROLE_USER (user)")
    if message.task_id:
        return await _answer(st, caller, message)
    text = text_of(message.parts)
    policy = _policy(params)
    context = message.context_id or None
    key: SessionKey | None = None
    asked_at = time.time()
    try:
        if context is None:  # a new conversation: its session is made first, and named
            opened = await open_session(st, caller, None, agent, message=text)
            key = opened.key
            turn = await submit(
                st, opened, caller, text, policy=policy, idempotency_key=_idempotency(message)
            )
        else:  # the admission finds the session: nothing is read or made first
            key = SessionKey.of(caller, context)
            turn = await send(
                st,
                caller,
                context,
                text,
                agent,
                create=False,
                policy=policy,
                idempotency_key=_idempotency(message),
            )
    except (SessionNotFound, InvalidSessionId):
        # A2A §3.4.1: a contextId the agent cannot accept is refused, and no new one is made.
        shown = str(context)[:128]
        raise error(
            TaskNotFoundError,
            f"no context {shown!r} here (unknown, expired or not yours): omit contextId to "
            "start a new conversation",
            contextId=shown,
        ) from None
    except (SessionBusy, LimitExceeded, ShuttingDown) as exc:
        return Begun(refused=tasks.rejected(key or _nowhere(caller, context), str(exc)))
    except IdempotencyKeyReused:
        raise error(
            InvalidParamsError,
            "this messageId already named another message in this context: give each new "
            "message its own messageId",
        ) from None
    except (InvalidInput, TooLarge) as exc:
        raise error(InvalidParamsError, str(exc)) from None
    # Followed from its first event: submitted, then its turn.started event (working).
    return Begun(as_taken(turn, asked_at))


def _nowhere(caller: Principal, context: str | None) -> SessionKey:
    """The key a refused message names when no session was made for it."""
    return SessionKey(caller.tenant, caller.user, context or "")


def text_of(parts: Sequence[pb.Part]) -> str:
    """A message's input: its text parts, and its data parts as JSON, one per line."""
    lines: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            lines.append(part.text)
        elif kind == "data":
            value = MessageToDict(part.data)
            lines.append(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        else:
            raise error(
                ContentTypeNotSupportedError,
                "this agent reads text and data parts, not files (raw or url parts)",
            )
    if not lines:
        raise error(InvalidParamsError, "message.parts is empty: send at least one text part")
    return "\n".join(lines)


def _policy(params: pb.SendMessageRequest) -> Policy:
    """``metadata.policy`` of the request, else of its message: what to do when the context
    is busy (tether's policies; enqueue by default). Clients put metadata in either place, and
    one the face read only in the request's was ignored when sent in the message's."""
    found = [
        (where, holder.metadata)
        for where, holder in (("metadata", params), ("message.metadata", params.message))
        if holder.HasField("metadata") and "policy" in holder.metadata
    ]
    if not found:
        return "enqueue"
    where, metadata = found[0]
    said = metadata["policy"]
    for policy in POLICIES:
        if said == policy:
            return policy
    raise error(InvalidParamsError, f"{where}.policy must be one of: {', '.join(POLICIES)}")


def _idempotency(message: pb.Message) -> str | None:
    """The messageId, as the turn's idempotency key: a retried message (same id, same
    context) is answered with the task the first one made, never run twice (A2A §3.3.1)."""
    mid = message.message_id
    return mid if _IDEMPOTENCY_KEY.fullmatch(mid) else None


# -- answering an input-required task --------------------------------------------------------
async def _answer(st: ServerState, caller: Principal, message: pb.Message) -> Begun:
    named = tasks.split_task_id(message.task_id)
    if named is not None and message.context_id and message.context_id != named[0]:
        raise error(
            InvalidParamsError,
            "contextId is not the context of the task taskId names: send its own, or none",
        )
    key, turn = await locate(st, caller, message.task_id)
    if turn.ended:
        raise error(
            UnsupportedOperationError,
            f"task {message.task_id!r} has ended ({turn.status}) and takes no more messages: "
            "send one without taskId to start a new task in its context",
        )
    pending = (
        await st.runtime.scheduler.decisions(key, turn_id=turn.id, status="pending")
        if turn.status == "awaiting_input"
        else []
    )
    if not pending:
        raise error(
            UnsupportedOperationError,
            f"task {message.task_id!r} is not input-required: a message to a task answers what "
            "it asks; send one without taskId to start a new task",
        )
    decision, verdict, answer = verdict_of(message.parts, pending)
    after = await last_seq(st, key, turn.id)
    try:
        await st.runtime.scheduler.decide(
            key, turn.id, decision.call_id, verdict, answer=answer, by=caller.user, principal=caller
        )
    except InvalidInput as exc:
        raise error(InvalidParamsError, str(exc)) from None
    except DecisionNotFound:
        raise error(InvalidParamsError, f"no decision {decision.call_id!r} pending") from None
    except DecisionMade as exc:
        raise error(
            UnsupportedOperationError, f"that was decided already ({exc.decision.status})"
        ) from None
    # Queued again by the decision, to go on wherever the session is taken next: the task as
    # it stands now; what it does from here is in its events after ``after``.
    return Begun(replace(turn, status="queued"), after=after)


def verdict_of(
    parts: Sequence[pb.Part], pending: Sequence[Decision]
) -> tuple[Decision, VerdictWord, str | None]:
    """Which pending decision a message answers, and how.

    A data part ``{"verdict": "approve"|"deny"|"always"|"answer", "answer": "…",
    "callId": "…"}`` says it outright (``{"answer": "…"}`` alone is an answer); otherwise the
    text does: for an approval one of approve, deny or always; for a question, the answer.
    Without ``callId`` it answers the first pending decision.
    """
    said: dict[str, object] = {}
    words: list[str] = []
    for part in parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            value = MessageToDict(part.data)
            if not isinstance(value, dict):
                raise error(InvalidParamsError, "a data part answering a task is an object")
            said = {**said, **value}
        elif kind == "text":
            words.append(part.text)
        else:
            raise error(ContentTypeNotSupportedError, "answer with text or a data part")
    target = _target(said.get("callId", said.get("call_id")), pending)
    verdict, answer = said.get("verdict"), said.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise error(InvalidParamsError, "answer must be text")
    if verdict is None and answer is None:
        text = " ".join(words).strip()
        if not text:
            raise error(InvalidParamsError, f"say what you decide: {tasks.ask(target)}")
        if target.kind == "question":
            return target, "answer", text
        verdict = text.lower().rstrip(".!")
        if verdict not in tasks.APPROVAL_VERDICTS:
            raise error(InvalidParamsError, f"not understood: {tasks.ask(target)}")
    chosen = "answer" if verdict is None else verdict
    for word in VERDICTS:
        if chosen == word:
            return target, word, answer
    raise error(InvalidParamsError, f"verdict must be one of: {', '.join(VERDICTS)}")


def _target(call_id: object, pending: Sequence[Decision]) -> Decision:
    if call_id is None:
        return pending[0]
    for d in pending:
        if d.call_id == call_id:
            return d
    ids = ", ".join(d.call_id for d in pending)
    raise error(InvalidParamsError, f"callId names no pending decision of this task ({ids})")


# -- tasks -----------------------------------------------------------------------------------
async def locate(st: ServerState, caller: Principal, task_id: str) -> tuple[SessionKey, Turn]:
    """The caller's turn a task id names; TaskNotFound for any other (unknown and another
    principal's alike: the id is looked up in the caller's namespace only)."""
    named = tasks.split_task_id(task_id)
    missing = error(TaskNotFoundError, f"no task {task_id[:300]!r} (unknown or not yours)")
    if named is None or not minted(named[1]):
        raise missing
    try:
        key = SessionKey.of(caller, named[0])
        await st.runtime.sessions.own(key)
    except (InvalidSessionId, SessionNotFound):
        raise missing from None
    turn = await st.runtime.sessions.turn(key, named[1])
    if turn is None:
        raise missing
    return key, turn


async def snapshot(st: ServerState, turn: Turn, history: int | None = None) -> pb.Task:
    """The task as the turn stands, with what it waits for."""
    scheduler = st.runtime.scheduler
    pending: list[Decision] = []
    if turn.status == "awaiting_input":
        pending = await scheduler.decisions(turn.key, turn_id=turn.id, status="pending")
    behind = await scheduler.parked_ahead(turn) if turn.status == "queued" else None
    return tasks.task_of(turn, pending, behind, history=history)


async def cancel(st: ServerState, caller: Principal, task_id: str) -> pb.Task:
    key, turn = await locate(st, caller, task_id)
    if turn.ended:
        raise error(
            TaskNotCancelableError,
            f"task {task_id[:300]!r} has ended ({turn.status}): there is nothing to cancel",
        )
    # An ended turn comes back as it ended: cancelled, or what it became first. A turn that
    # takes longer than the bound to stop is answered as it stands (it still stops).
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(CANCEL_WAIT):
            turn = await st.runtime.scheduler.cancel(key, turn.id, "cancelled")
            return await snapshot(st, turn)
    return await snapshot(st, await st.runtime.sessions.turn(key, turn.id) or turn)


async def last_seq(st: ServerState, key: SessionKey, turn_id: str) -> int:
    """The seq of the turn's latest event (a stream that goes on from here repeats nothing)."""
    return await st.runtime.sessions.latest_event_seq(key, turn_id)


def history_of(params: pb.SendMessageRequest | pb.GetTaskRequest) -> int | None:
    if isinstance(params, pb.SendMessageRequest):
        config = params.configuration
        return config.history_length if config.HasField("history_length") else None
    return params.history_length if params.HasField("history_length") else None
