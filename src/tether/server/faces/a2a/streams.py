"""A turn's events (``scheduler.events``) as A2A stream events, and their SSE frames.

The stream opens with the task, then: ``turn.started`` / ``turn.resumed`` → status
``working``; each ``message.delta`` → a chunk of the ``reply`` artifact (``append`` after the
first); ``turn.awaiting_input`` → status ``input-required`` saying what is asked, and the
stream ends (answer with a message naming the task, which streams the rest); ``turn.ended`` →
the final status, and the stream ends. A subscriber joining midway gets the reply's text so
far as its first chunk. When the chunks do not add up to the turn's reply (a reply made of
several model steps), the whole reply is sent once more as the artifact (``append`` false,
``lastChunk`` true) before the final status.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from a2a.types import a2a_pb2 as pb

from tether.events import MESSAGE_DELTA, TURN_AWAITING_INPUT, TURN_ENDED, TURN_RESUMED, TURN_STARTED
from tether.records import Event, Turn
from tether.server import sse
from tether.server.faces.a2a import tasks
from tether.server.state import ServerState


async def follow(
    st: ServerState, turn: Turn, after_seq: int, *, joined: bool = False
) -> AsyncIterator[pb.StreamResponse]:
    """The turn's A2A events after its event ``after_seq``, until it ends or asks a human.
    ``joined``: a subscriber that joins midway (its task shown as at ``after_seq``) gets the
    reply's text so far first, as one chunk, and the rest as it comes."""
    tid = tasks.task_id(turn.key, turn.id)
    sid = turn.key.session_id
    streamed: list[str] = []

    def update(status: pb.TaskStatus) -> pb.StreamResponse:
        event = pb.TaskStatusUpdateEvent(task_id=tid, context_id=sid, status=status)
        return pb.StreamResponse(status_update=event)

    def chunk(text: str, *, append: bool, last: bool) -> pb.StreamResponse:
        artifact = pb.Artifact(
            artifact_id=tasks.REPLY, name=tasks.REPLY, parts=[pb.Part(text=text)]
        )
        event = pb.TaskArtifactUpdateEvent(
            task_id=tid, context_id=sid, artifact=artifact, append=append, last_chunk=last
        )
        return pb.StreamResponse(artifact_update=event)

    catch_up = after_seq if joined else 0
    events = st.runtime.scheduler.events(turn.key, turn.id, after_seq=0 if joined else after_seq)
    try:
        async for event in events:
            if event.seq <= catch_up:
                # Already shown by the task it joined with, but for the reply's text so far.
                if event.type == MESSAGE_DELTA and (text := str(event.data.get("text") or "")):
                    streamed.append(text)
                if event.seq == catch_up and streamed:
                    yield chunk("".join(streamed), append=False, last=False)
                continue
            if event.type in (TURN_STARTED, TURN_RESUMED):
                yield update(tasks.status_of(replace(turn, status="running"), at=event.created_at))
            elif event.type == MESSAGE_DELTA:
                text = str(event.data.get("text") or "")
                if text:
                    yield chunk(text, append=bool(streamed), last=False)
                    streamed.append(text)
            elif event.type == TURN_AWAITING_INPUT:
                pending = await st.runtime.scheduler.decisions(
                    turn.key, turn_id=turn.id, status="pending"
                )
                if pending:  # none: decided already, and the turn goes on
                    parked = replace(turn, status="awaiting_input")
                    yield update(tasks.status_of(parked, pending, at=event.created_at))
                    return
            elif event.type == TURN_ENDED:
                ended = _ended(turn, event)
                if ended.status == "completed" and ended.output:
                    if "".join(streamed) != ended.output:
                        yield chunk(ended.output, append=False, last=True)
                    else:
                        yield chunk("", append=True, last=True)
                yield update(tasks.status_of(ended))
                return
    finally:
        await events.aclose()


def _ended(turn: Turn, event: Event) -> Turn:
    """The turn as its ``turn.ended`` says it ended (the store holds the same, written with it)."""
    data = event.data
    return replace(
        turn,
        status=data.get("status", "failed"),
        reason=data.get("reason"),
        output=data.get("output"),
        complete=bool(data.get("complete")),
        error=data.get("error"),
        ran_by=data.get("agent") or turn.ran_by,
        ended_at=event.created_at,
    )


def frames(items: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """SSE ``data:`` frames of JSON-RPC answers, with a comment line every idle
    :data:`tether.server.sse.PING_SECONDS`; closing this closes ``items``."""
    return sse.encoded(items, _data_frame, sse.PING_SECONDS)


def _data_frame(item: dict[str, Any]) -> bytes:
    data = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
