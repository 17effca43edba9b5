"""A response's ``response.*`` events, numbered by ``sequence_number``: streamed live by the
request that made it, and read again (from any process) by ``GET …?stream=true``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from tether.events import MESSAGE_DELTA, TURN_AWAITING_INPUT, TURN_ENDED
from tether.records import Turn, Usage
from tether.server.faces.endings import Waiting, unless_behind_a_human
from tether.server.faces.openai.errors import awaiting_message, error_body, waiting_error
from tether.server.faces.openai.response_objects import Asked, message_item, response_object
from tether.server.state import ServerState


def frame(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def _still_waits(st: ServerState, turn: Turn, call_id: object) -> bool:
    """Whether ``turn`` waits now on the decision of ``call_id`` (not on a later one: a turn
    may wait twice, and a stream read again passes over the first wait)."""
    if turn.status != "awaiting_input":
        return False
    pending = await st.runtime.scheduler.decisions(turn.key, turn_id=turn.id, status="pending")
    return any(d.call_id == call_id for d in pending)


async def response_events(
    st: ServerState, turn: Turn, asked: Asked, *, live: Turn | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The turn as ``response.*`` events, ``sequence_number`` counting from 0. ``live``: the
    turn as the request that made it now has it; then a turn that waits in the queue behind a
    human's decision is withdrawn and the stream ends saying so (a replay only reads)."""
    number = 0
    item_id = f"msg_{turn.id}"
    texts: list[str] = []

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal number
        number += 1
        return {"type": kind, "sequence_number": number - 1, **fields}

    def part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def where() -> dict[str, Any]:
        return {"item_id": item_id, "output_index": 0, "content_index": 0}

    obj = response_object(turn, asked)
    yield event("response.created", response=obj)
    yield event("response.in_progress", response={**obj, "status": "in_progress"})
    events = st.runtime.scheduler.events(turn.key, turn.id)
    async for ev in unless_behind_a_human(st, live, events) if live is not None else events:
        if isinstance(ev, Waiting):
            body = waiting_error(ev)["error"]
            yield event("error", code=body["code"], message=body["message"], param=None)
            return
        if ev.type == MESSAGE_DELTA:
            piece = str(ev.data.get("text", ""))
            if not texts:
                item = message_item(turn, "", "in_progress")
                yield event("response.output_item.added", output_index=0, item=item)
                yield event("response.content_part.added", **where(), part=part(""))
            texts.append(piece)
            yield event("response.output_text.delta", **where(), delta=piece, logprobs=[])
        elif ev.type == TURN_AWAITING_INPUT:
            # Each wait takes one number, told or not, so that a stream read live and one read
            # again later number every event alike: told (and the stream ends) while the turn
            # still waits; passed over once it went on (its events follow) or ended.
            done = await st.runtime.sessions.turn(turn.key, turn.id)
            if done is None:
                return
            if not await _still_waits(st, done, ev.data.get("call_id")):
                number += 1
                continue
            body = error_body(409, awaiting_message(done), "awaiting_input", None)["error"]
            yield event("error", code=body["code"], message=body["message"], param=None)
            return
        elif ev.type == TURN_ENDED:
            done = await st.runtime.sessions.turn(turn.key, turn.id)
            if done is None or not done.ended:
                return
            final = response_object(done, asked)
            if texts or done.output:
                text = done.output if done.output is not None else "".join(texts)
                state = "completed" if done.complete else "incomplete"
                if not texts:
                    item = message_item(done, "", "in_progress")
                    yield event("response.output_item.added", output_index=0, item=item)
                    yield event("response.content_part.added", **where(), part=part(""))
                yield event("response.output_text.done", **where(), text=text, logprobs=[])
                yield event("response.content_part.done", **where(), part=part(text))
                yield event(
                    "response.output_item.done",
                    output_index=0,
                    item=message_item(done, text, state),
                )
            status = final["status"]
            kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
            yield event(kind.get(status, "response.failed"), response=final)
            return


def as_created(turn: Turn) -> Turn:
    """``turn`` as it stood when its request took it: the first events of a replayed stream
    say what they said live (queued, nothing answered yet), so their sequence numbers name
    the same events."""
    return replace(
        turn,
        status="queued",
        reason=None,
        error=None,
        output=None,
        complete=True,
        usage=Usage(),
        started_at=None,
        ended_at=None,
    )


async def later_than(
    events: AsyncIterator[dict[str, Any]], after: int
) -> AsyncIterator[dict[str, Any]]:
    """Those of ``events`` numbered after ``after`` (``starting_after``)."""
    async for event in events:
        if event["sequence_number"] > after:
            yield event
