"""A run's server-sent events in LangGraph's vocabulary, made from the turn's own events.

``metadata`` comes first; then, per ``stream_mode``: ``values`` (the thread's whole
``messages`` state after each step), ``updates`` (``{"model" | "tools": {"messages": […]}}``),
``messages`` for ``messages-tuple`` (``[chunk, metadata]``, a chunk per ``message.delta``), and
``messages/metadata``, ``messages/partial``, ``messages/complete`` for ``messages``. A failed
turn (or one stopped by a limit) sends ``error`` (``{"error": <reason>, "message": …}``); every
stream that reaches the run's end closes with ``end`` (``{"run_id", "thread_id", "status"}``). A
turn that stops to wait for a human decision sends ``values`` (and ``updates``) holding
``__interrupt__`` and ends there. The modes tether has nothing for (``custom``, ``events``,
``debug``, ``tasks``, ``checkpoints``, ``tools``, ``lifecycle``) are accepted and stay silent.

Frames are a pure function of the turn's event log: the frames of event ``seq`` are numbered
``<seq>-<k>`` over every mode's frames, then filtered by the modes asked for. A stream that
resumes with ``Last-Event-ID`` rebuilds its state from the turn's first event and sends only
the frames after that id — no gap, no duplicate, whichever modes it asks for.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from tether import events as ev
from tether.records import Event, SessionKey, Turn
from tether.server import sse
from tether.server.faces.langgraph._errors import invalid
from tether.server.faces.langgraph._messages import Message, TurnMessages, ai, chunk_of
from tether.server.faces.langgraph._resume import parked_on
from tether.server.faces.langgraph._state import messages_before
from tether.server.faces.langgraph._wire import interrupt_of, run_status
from tether.server.sse import PING_SECONDS
from tether.server.state import ServerState

STREAM_MODES = frozenset(
    {
        "values",
        "updates",
        "messages",
        "messages-tuple",
        "custom",
        "events",
        "debug",
        "tasks",
        "checkpoints",
        "tools",
        "lifecycle",
    }
)
_ALWAYS = "*"
"""The mode of frames every stream gets: metadata, error, end."""
_RESUME_ID = re.compile(r"([0-9]{1,18})-([0-9]{1,6})")

Frame = tuple[str, str, Any]
"""(mode, event name, data)."""


def stream_modes(raw: object, default: tuple[str, ...] = ("values",)) -> frozenset[str]:
    """The modes a body or query names (a string or a list of them)."""
    if raw is None or raw == []:
        return frozenset(default)
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise invalid("stream_mode must be a mode's name or a list of them")
    unknown = sorted(set(names) - STREAM_MODES)
    if unknown:
        raise invalid(
            f"unknown stream_mode {', '.join(unknown)}: use {', '.join(sorted(STREAM_MODES))}"
        )
    return frozenset(names)


def resume_point(last_event_id: str | None) -> tuple[int, int]:
    """``(seq, k)`` of ``Last-Event-ID`` (``<seq>-<k>``); ``(-1, 0)``: from the start."""
    if not last_event_id or not last_event_id.strip():
        return (-1, 0)
    match = _RESUME_ID.fullmatch(last_event_id.strip())
    if match is None:
        raise invalid("Last-Event-ID must be the id of an event of this run's stream")
    return (int(match[1]), int(match[2]))


@dataclass(frozen=True)
class RunInfo:
    """What a run's frames name: the turn, its thread and the assistant it was sent to."""

    key: SessionKey
    turn: Turn
    assistant_id: str

    @property
    def thread_id(self) -> str:
        return self.key.session_id


class RunFrames:
    """Turns the events of one turn into LangGraph frames (see the module's docstring)."""

    def __init__(self, st: ServerState, run: RunInfo) -> None:
        self.st = st
        self.run = run
        self.turn = TurnMessages(run.turn.id)
        self._prior: list[Message] | None = None
        self._streamed: dict[str, str] = {}
        """Text streamed so far for each AI message id (``message.delta``)."""
        self._decision: dict[str, Any] | None = None
        self._shown = -1
        """How many messages the last ``values`` frame held (-1: none sent yet)."""

    def _meta(self, node: str) -> dict[str, Any]:
        return {
            "run_id": self.run.turn.id,
            "thread_id": self.run.thread_id,
            "assistant_id": self.run.assistant_id,
            "graph_id": self.run.assistant_id,
            "langgraph_node": node,
        }

    async def _values(self, force: bool = False, **extra: Any) -> list[Frame]:
        if self._prior is None:
            self._prior = await messages_before(self.st, self.run.key, self.run.turn)
        messages = [*self._prior, *self.turn.messages]
        if not force and not extra and len(messages) == self._shown:
            return []
        self._shown = len(messages)
        return [("values", "values", {"messages": messages, **extra})]

    def first(self) -> list[Frame]:
        data = {"run_id": self.run.turn.id, "thread_id": self.run.thread_id, "attempt": 1}
        return [(_ALWAYS, "metadata", data)]

    async def of(self, event: Event, still_parked: bool) -> list[Frame]:
        """The frames of one event (all modes); ``still_parked``: whether the turn waits for
        a decision now (read only at ``turn.awaiting_input``)."""
        kind, data = event.type, event.data
        if kind == ev.TOOL_CALL:
            self.turn.add_call(str(data["call_id"]), str(data["name"]), str(data["arguments"]))
            return []
        frames = await self._closed()
        if kind == ev.TURN_STARTED:
            self.turn.add_human(self.run.turn.input)
            frames += await self._values()
        elif kind == ev.MESSAGE_DELTA:
            frames += self._delta(str(data.get("text", "")))
        elif kind == ev.MESSAGE_COMPLETED:
            self.turn.add_text(str(data.get("text", "")), data.get("complete") is not False)
        elif kind == ev.TOOL_RESULT:
            frames += await self._result(data)
        elif kind == ev.DECISION_REQUESTED:
            self._decision = data
        elif kind == ev.TURN_AWAITING_INPUT:
            frames += await self._parked(still_parked)
        elif kind == ev.TURN_ENDED:
            frames += await self._ended(data)
        return frames

    def _delta(self, text: str) -> list[Frame]:
        mid = self.turn.next_ai_id()
        first = mid not in self._streamed
        self._streamed[mid] = self._streamed.get(mid, "") + text
        whole = chunk_of(ai(mid, self._streamed[mid]))
        frames: list[Frame] = []
        if first:
            frames.append(
                ("messages", "messages/metadata", {mid: {"metadata": self._meta("model")}})
            )
        frames.append(("messages", "messages/partial", [whole]))
        frames.append(
            ("messages-tuple", "messages", [{**whole, "content": text}, self._meta("model")])
        )
        return frames

    async def _closed(self) -> list[Frame]:
        """Frames for the AI message that ends here (its text and calls are all in)."""
        message = self.turn.close()
        if message is None:
            return []
        mid = message["id"]
        frames: list[Frame] = [("updates", "updates", {"model": {"messages": [message]}})]
        if mid not in self._streamed:
            frames.append(("messages-tuple", "messages", [message, self._meta("model")]))
        elif message["tool_calls"]:
            frames.append(
                ("messages-tuple", "messages", [chunk_of(message, ""), self._meta("model")])
            )
        frames.append(("messages", "messages/complete", [message]))
        return frames + await self._values()

    async def _result(self, data: dict[str, Any]) -> list[Frame]:
        message = self.turn.add_result(
            str(data["call_id"]), str(data["name"]), str(data["output"]), bool(data.get("error"))
        )
        frames: list[Frame] = [
            ("updates", "updates", {"tools": {"messages": [message]}}),
            ("messages-tuple", "messages", [message, self._meta("tools")]),
            ("messages", "messages/complete", [message]),
        ]
        return frames + await self._values()

    async def _parked(self, still_parked: bool) -> list[Frame]:
        interrupts = [interrupt_of(self._decision)] if self._decision else []
        frames: list[Frame] = [("updates", "updates", {"__interrupt__": interrupts})]
        frames += await self._values(force=True, __interrupt__=interrupts)
        if still_parked:
            frames.append(self._end("interrupted"))
        return frames

    async def _ended(self, data: dict[str, Any]) -> list[Frame]:
        status = str(data.get("status", ""))
        frames: list[Frame] = []
        if status in ("failed", "limit_reached"):
            reason = str(data.get("reason") or status)
            message = str(data.get("error") or f"the run ended {status} ({reason})")
            frames.append((_ALWAYS, "error", {"error": reason, "message": message}))
        else:
            frames += await self._values()
        ended = run_status(status)
        return [*frames, self._end(ended)]

    def _end(self, status: str) -> Frame:
        return (
            _ALWAYS,
            "end",
            {"run_id": self.run.turn.id, "thread_id": self.run.thread_id, "status": status},
        )


def _sse(frame_id: str, event: str, data: Any) -> bytes:
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {frame_id}\nevent: {event}\ndata: {body}\n\n".encode()


async def run_stream(
    st: ServerState,
    run: RunInfo,
    modes: frozenset[str],
    after: tuple[int, int] = (-1, 0),
    ping: float = PING_SECONDS,
    *,
    metadata: bool = False,
) -> AsyncIterator[bytes]:
    """The run's SSE frames after ``after``, until its end (or until it waits for a human);
    ``metadata``: the ``metadata`` frame first even so (a resumed run's new stream)."""
    frames = RunFrames(st, run)
    wanted = modes | {_ALWAYS}

    def emit(seq: int, made: list[Frame]) -> list[bytes]:
        out = []
        for k, (mode, name, data) in enumerate(made):
            if mode in wanted and (seq, k) > after:
                out.append(_sse(f"{seq}-{k}", name, data))
        return out

    if metadata and after >= (0, 0):
        # A resumed run's new stream: its metadata is numbered where it picks up, so that a
        # client resuming after it gets what follows, not the frames before the interrupt.
        (_, name, data), *_ = frames.first()
        yield _sse(f"{after[0]}-{after[1]}", name, data)
    for chunk in emit(0, frames.first()):
        yield chunk
    scheduler = st.runtime.scheduler
    async for event in sse.pinged(scheduler.events(run.key, run.turn.id), ping):
        if event is None:
            yield b": ping\n\n"
            continue
        parked = False
        if event.type == ev.TURN_AWAITING_INPUT:
            call_id = str(event.data.get("call_id", ""))
            parked = await parked_on(st, run.key, run.turn.id, call_id)
        made = await frames.of(event, parked)
        for chunk in emit(event.seq, made):
            yield chunk
        if made and made[-1][1] == "end":
            return
