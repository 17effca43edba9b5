"""A response's ``response.*`` events, numbered by ``sequence_number``: streamed live by the
request that made it, and read again (from any process) by ``GET …?stream=true``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from tether.events import (
    MESSAGE_COMPLETED,
    MESSAGE_DELTA,
    TURN_AWAITING_INPUT,
    TURN_ENDED,
    TURN_RESUMED,
    TURN_STARTED,
)
from tether.records import Event, Turn, Usage
from tether.server.faces.endings import Waiting, unless_behind_a_human
from tether.server.faces.openai.errors import awaiting_message, error_body, waiting_error
from tether.server.faces.openai.response_objects import (
    Asked,
    message_id,
    message_item,
    response_object,
)
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


class _Items:
    """The ``response.*`` events of one response, numbered as they are made: each message the
    turn says is an output item of its own (added, its text in pieces, done)."""

    def __init__(self, turn: Turn, obj: dict[str, Any]) -> None:
        self.turn = turn
        self.obj = obj
        """The response as ``response.created`` showed it."""
        self.started = obj["status"] != "queued"
        self.number = 0
        self.index = 0  # the output item (message) under way, or next
        self.pieces: list[str] = []  # its text so far
        self.open = False
        self.said: list[str] = []  # the messages ended so far

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.number += 1
        return {"type": kind, "sequence_number": self.number - 1, **fields}

    def _where(self) -> dict[str, Any]:
        item_id = message_id(self.turn, self.index)
        return {"item_id": item_id, "output_index": self.index, "content_index": 0}

    def _opened(self) -> Iterator[dict[str, Any]]:
        if not self.open:
            self.open = True
            item = message_item(self.turn, "", "in_progress", self.index)
            yield self.event("response.output_item.added", output_index=self.index, item=item)
            yield self.event("response.content_part.added", **self._where(), part=_part(""))

    def delta(self, piece: str) -> Iterator[dict[str, Any]]:
        yield from self._opened()
        self.pieces.append(piece)
        yield self.event("response.output_text.delta", **self._where(), delta=piece, logprobs=[])

    def closed(self, text: str | None, state: str) -> Iterator[dict[str, Any]]:
        """The message under way ends, with ``text`` (None: what its pieces made)."""
        text = "".join(self.pieces) if text is None else text
        yield from self._opened()
        yield self.event("response.output_text.done", **self._where(), text=text, logprobs=[])
        yield self.event("response.content_part.done", **self._where(), part=_part(text))
        item = message_item(self.turn, text, state, self.index)
        yield self.event("response.output_item.done", output_index=self.index, item=item)
        self.said.append(text)
        self.open, self.index, self.pieces = False, self.index + 1, []

    def head(self) -> Iterator[dict[str, Any]]:
        yield self.event("response.created", response=self.obj)
        if self.started:
            yield self._in_progress()

    def _in_progress(self) -> dict[str, Any]:
        return self.event("response.in_progress", response={**self.obj, "status": "in_progress"})

    def on(self, ev: Event) -> Iterator[dict[str, Any]]:
        """What the turn's event ``ev`` is in the response's events, when it needs no read.
        In progress once the turn runs: one queued behind others says so until it starts."""
        if not self.started and ev.type in (TURN_STARTED, TURN_RESUMED):
            self.started = True
            yield self._in_progress()
        if ev.type == MESSAGE_DELTA:
            yield from self.delta(str(ev.data.get("text", "")))
        elif ev.type == MESSAGE_COMPLETED:
            text = str(ev.data.get("text") or "")
            if text or self.open:
                state = "completed" if ev.data.get("complete", True) else "incomplete"
                yield from self.closed(text or None, state)

    def ended(self, done: Turn) -> Iterator[dict[str, Any]]:
        if self.open or (not self.said and done.output):
            # Ended with a message under way (its process was lost), or said without events.
            state = "completed" if done.complete else "incomplete"
            yield from self.closed(None if self.open else done.output, state)


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def response_events(
    st: ServerState, turn: Turn, asked: Asked, *, live: Turn | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The turn as ``response.*`` events, ``sequence_number`` counting from 0. ``live``: the
    turn as the request that made it now has it; then a turn that waits in the queue behind a
    human's decision is withdrawn and the stream ends saying so (a replay only reads)."""
    out = _Items(turn, response_object(turn, asked))
    for e in out.head():
        yield e
    events = st.runtime.scheduler.events(turn.key, turn.id)
    async for ev in unless_behind_a_human(st, live, events) if live is not None else events:
        if isinstance(ev, Waiting):
            body = waiting_error(ev)["error"]
            yield out.event("error", code=body["code"], message=body["message"], param=None)
            return
        for e in out.on(ev):
            yield e
        if ev.type == TURN_AWAITING_INPUT:
            # Each wait takes one number, told or not, so that a stream read live and one read
            # again later number every event alike: told (and the stream ends) while the turn
            # still waits; passed over once it went on (its events follow) or ended.
            done = await st.runtime.sessions.turn(turn.key, turn.id)
            if done is None:
                return
            if not await _still_waits(st, done, ev.data.get("call_id")):
                out.number += 1
                continue
            body = error_body(409, awaiting_message(done), "awaiting_input", None)["error"]
            yield out.event("error", code=body["code"], message=body["message"], param=None)
            return
        elif ev.type == TURN_ENDED:
            done = await st.runtime.sessions.turn(turn.key, turn.id)
            if done is None or not done.ended:
                return
            for e in out.ended(done):
                yield e
            final = response_object(done, asked, out.said)
            kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
            yield out.event(kind.get(final["status"], "response.failed"), response=final)
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
