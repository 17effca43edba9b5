"""The AG-UI face: ``POST /agui/{agent}`` takes a ``RunAgentInput`` and streams AG-UI events.

For CopilotKit-style frontends (``@ag-ui/client``'s ``HttpAgent`` pointed at the URL). The
``threadId`` is a tether session in the caller's namespace, made the first time it is named
(AG-UI clients mint thread ids themselves); ``runId`` is echoed on ``RUN_STARTED`` and the run's
last event. The history is tether's, so the input is only the **last message** of
``messages``, which must be the user's, on a new thread as on an existing one: a client that
resends the whole conversation does not duplicate it, and the other messages (system,
assistant, tool) are not sent to the agent. A conversation that ends with another message (the
agent's own reply: nothing new was said) is refused (400) rather than answered again. Only
text content parts are taken. The same run sent again (its ``runId``, the last message's
``id`` and its text unchanged: a client retrying) is the same turn, its events streamed from
the start, never a second turn.

The stream (SSE ``data:`` lines of ``ag_ui.encoder.EventEncoder``, and a comment line every
few idle seconds, :data:`tether.server.sse.PING_SECONDS`): ``RUN_STARTED``; a ``CUSTOM``
event ``tether.turn`` ``{turn_id, session_id, cancel}`` naming the turn (a Stop button POSTs to
``cancel``: a closed stream does not stop a turn); the agent's
text as ``TEXT_MESSAGE_START`` / ``TEXT_MESSAGE_CONTENT`` (from tether's ``message.delta``) /
``TEXT_MESSAGE_END``; each tool the agent runs (tether runs it: these are not frontend tools) as
``TOOL_CALL_START`` / ``TOOL_CALL_ARGS`` / ``TOOL_CALL_END`` then ``TOOL_CALL_RESULT``; and one
last event: ``RUN_FINISHED`` (success outcome; ``result`` ``{turn_id, reply, complete}``) only
for a completed turn, ``RUN_ERROR`` with a ``message`` and a ``code`` for every other ending
(``model_error``, ``failed``, ``cancelled``, ``interrupted``, ``limit_reached``…; AG-UI 1.0's
cancelled outcome is not used: a consumer that predates it would read it as a success).

A turn that waits for a human decision (a tool approval, ``ask_user``) ends the run with
``RUN_FINISHED`` whose outcome is an **interrupt** (AG-UI 1.0's interrupt/resume), preceded by a
``CUSTOM`` event ``tether.awaiting_input`` for consumers that predate outcomes. The interrupt's
id is the decision's ``call_id``; ``responseSchema`` says the answer: ``{"decision": "approve" |
"deny" | "always"}`` for an approval, ``{"answer": "..."}`` for a question (a bare string or
boolean is taken too). The client answers with a follow-up run on the same thread carrying
``resume: [{interruptId, status: "resolved", payload}]`` (``status: "cancelled"`` refuses): the
face decides the decisions and streams the rest of the same turn. A resume must answer the
thread's open interrupt; its ``messages`` are not input. (The same decision can be made through
tether's own API, ``POST /v1/sessions/{sid}/turns/{tid}/decisions``.) A new message on a thread
whose turn waits for a decision is refused (``RUN_ERROR`` code ``awaiting_input``) and sent
nowhere.

Refusals before a run (no valid key 401, an unknown agent 404, a body that is not a
``RunAgentInput``, a bad thread id, or frontend ``tools`` 400) are tether's problem+json (the
agent's tools run inside tether, so a frontend's own would never be called; ``state``,
``context`` and ``forwardedProps`` are ignored); once the run has started,
every refusal is ``RUN_ERROR`` with tether's reason code. A client that goes away mid-run does
not stop the turn: it runs to its end and stays readable through tether's API (or cancel it
there). ``TETHER_FACES_AGUI=off`` switches the face off.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    CustomEvent,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunStartedEvent,
    TextPart,
)
from ag_ui.encoder import EventEncoder
from fastapi import APIRouter, Request
from pydantic import ValidationError
from starlette.responses import Response, StreamingResponse

from tether import events
from tether.errors import InvalidInput, SessionNotFound, TetherError
from tether.records import SESSION_ID_PATTERN, Decision, Principal, SessionKey, Turn, Verdict
from tether.server import sse
from tether.server.conversation import agent_named, open_session, send
from tether.server.deps import State, check_message
from tether.server.faces.agui_events import Translation
from tether.server.faces.endings import refusal
from tether.server.problems import Problem
from tether.server.state import ServerState

log = logging.getLogger(__name__)

router = APIRouter(tags=["ag-ui"])


class _Refused(Exception):
    """A refusal with a code of this face's own (RUN_ERROR)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Not in the OpenAPI document: the body and the stream are AG-UI's (its own schema, its own
# event models), as /mcp is MCP's.
@router.post("/agui/{agent}", include_in_schema=False)
async def run_agent(agent: str, request: Request, st: State) -> Response:
    """Run the agent ``agent`` on the thread a ``RunAgentInput`` names, streaming AG-UI events."""
    caller = await st.auth.resolve(request, placeholder_keys=True)
    agent_named(st, agent)
    run = _parse(await request.body())
    if run.tools:
        # The agent's tools run inside tether; a frontend's own would never be called.
        raise InvalidInput(
            "frontend tools are not supported: the agent's own tools run inside tether "
            f"(got {', '.join(t.name for t in run.tools)})"
        )
    message = None if run.resume else _said(run)
    return StreamingResponse(
        sse.encoded(_stream(st, caller, agent, run, message), str.encode),
        media_type=EventEncoder().get_content_type(),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _parse(raw: bytes) -> RunAgentInput:
    try:
        run = RunAgentInput.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(f"the body is not a RunAgentInput ({where}: {first['msg']})") from None
    if not SESSION_ID_PATTERN.fullmatch(run.thread_id):
        raise InvalidInput("threadId must be 1-128 characters of letters, digits and '._:-'")
    return run


@dataclass(frozen=True)
class _Said:
    """A run's new input: the text of its last message, the user's, and the key that makes the
    same run sent again the same turn."""

    text: str
    retry_key: str


def _said(run: RunAgentInput) -> _Said:
    """The new input: the last message, which must be the user's (tether keeps the history)."""
    if not run.messages:
        raise InvalidInput("messages holds no user message (and there is no resume)")
    message = run.messages[-1]
    if message.role != "user":
        # The conversation as the client has it ends with the agent's reply (or the like):
        # answering its last user message again would put a second answer in the history.
        raise InvalidInput(
            f"the last message is a {message.role} message, so there is nothing new to answer: "
            "send the user's new message last (tether keeps the history)"
        )
    if isinstance(message.content, str):
        text = message.content
    else:
        parts = []
        for part in message.content:
            if not isinstance(part, TextPart):
                raise InvalidInput("only text content parts are supported")
            parts.append(part.text)
        text = "\n".join(parts)  # one line a part, as the other doors join them
    # The turn's idempotency key: a retried run (same run, same message, same text) gets the
    # turn the first one made. Hashed: a run id or message id may hold any character; the text
    # is in it so that ids a client reuses for another message never refuse that message.
    said = json.dumps([run.run_id, message.id, text]).encode()
    return _Said(text, "agui-" + hashlib.sha256(said).hexdigest()[:40])


async def _stream(
    st: ServerState, caller: Principal, agent: str, run: RunAgentInput, message: _Said | None
) -> AsyncIterator[str]:
    encoder = EventEncoder()
    started = RunStartedEvent(
        thread_id=run.thread_id, run_id=run.run_id, protocol_version=PROTOCOL_VERSION
    )
    yield encoder.encode(started)
    translation = Translation(run.thread_id, run.run_id)
    # A client that goes away ends this generator (GeneratorExit): nothing here cancels the
    # turn, which runs on like any other door's.
    try:
        async for event in _events(st, caller, agent, run, message, translation):
            yield encoder.encode(event)
    except _Refused as exc:
        yield _failed(encoder, translation, exc.message, exc.code)
    except (TetherError, Problem) as exc:
        said = refusal(exc)
        yield _failed(encoder, translation, said.message, said.code)
    except Exception:
        log.exception("the AG-UI run failed")
        yield _failed(encoder, translation, "an internal error occurred", "internal_error")


def _failed(encoder: EventEncoder, translation: Translation, message: str, code: str) -> str:
    closing = "".join(encoder.encode(e) for e in translation.close())
    return closing + encoder.encode(RunErrorEvent(message=message, code=code))


async def _events(
    st: ServerState,
    caller: Principal,
    agent: str,
    run: RunAgentInput,
    message: _Said | None,
    translation: Translation,
) -> AsyncIterator[BaseEvent]:
    if message is None:
        opened = await open_session(st, caller, run.thread_id, agent, create=True)
        turn, answered = await _resume(st, caller, opened.key, run.resume or [])
        yield _turn_event(turn)
        async for event in _follow(st, opened.key, turn, translation, answered):
            yield event
        return
    check_message(st, message.text)  # its size first, as before anything is read
    await _refuse_if_waiting(st, SessionKey.of(caller, run.thread_id))
    # The admission finds the thread's session; one that is not there (or expired) is made.
    turn = await send(
        st, caller, run.thread_id, message.text, agent, idempotency_key=message.retry_key
    )
    yield _turn_event(turn)
    async for event in _follow(st, turn.key, turn, translation, None):
        yield event


def _turn_event(turn: Turn) -> CustomEvent:
    """Which tether turn this run is, as soon as it is known: a Stop button cancels it with
    ``POST`` to ``cancel`` (AG-UI has no cancel of its own; a closed stream is not one)."""
    where = f"/v1/sessions/{turn.key.session_id}/turns/{turn.id}"
    value = {"turn_id": turn.id, "session_id": turn.key.session_id, "cancel": f"{where}/cancel"}
    return CustomEvent(name=TURN_EVENT, value=value)


TURN_EVENT = "tether.turn"


async def _refuse_if_waiting(st: ServerState, key: SessionKey) -> None:
    """A new message while the thread waits for a decision would only queue behind it."""
    try:
        pending = await st.runtime.scheduler.decisions(key, status="pending", limit=1)
    except SessionNotFound:
        return  # a new thread: its session is made as the message is sent
    if pending and not await _expired(st, key):
        d = pending[0]
        raise _Refused(
            "awaiting_input",
            f"this thread waits for an answer to interrupt {d.call_id} (turn {d.turn_id}): "
            "resume it (RunAgentInput.resume) first; the message was not sent",
        )


async def _expired(st: ServerState, key: SessionKey) -> bool:
    """Whether the thread's session has expired (its id then starts afresh, whatever it was
    waiting for)."""
    record = await st.runtime.sessions.get(key)
    return record is None or record.expired()


async def _follow(
    st: ServerState,
    key: SessionKey,
    turn: Turn,
    translation: Translation,
    answered: set[str] | None,
) -> AsyncIterator[BaseEvent]:
    """The turn's events as AG-UI events, up to its end or its next decision. A resumed turn's
    events are replayed from the start and skipped up to the park its answers ended (``answered``
    names those decisions): what came before was the earlier run's."""
    skipping = answered is not None
    seen = False
    asked: dict[str, object] | None = None
    async for event in st.runtime.scheduler.events(key, turn.id):
        if skipping:
            seen = seen or (
                event.type == events.DECISION_REQUESTED
                and event.data.get("call_id") in (answered or set())
            )
            if not seen or event.type in (events.DECISION_REQUESTED, events.TURN_AWAITING_INPUT):
                continue
            skipping = False
        if event.type == events.DECISION_REQUESTED:
            asked = dict(event.data)
        elif event.type == events.TURN_AWAITING_INPUT and asked is not None:
            for out in translation.interrupted(key.session_id, asked):
                yield out
            return
        elif event.type == events.TURN_ENDED:
            ended = await st.runtime.sessions.turn(key, turn.id)
            for out in translation.ended(ended or turn):
                yield out
            return
        else:
            for out in translation.event(event):
                yield out
    # The stream ended with no ending: this process is shutting down with the turn still to run.
    raise _Refused(
        "server_stopping",
        f"this server is shutting down; turn {turn.id} goes on: follow "
        f"GET /v1/sessions/{key.session_id}/turns/{turn.id}/events",
    )


async def _resume(
    st: ServerState, caller: Principal, key: SessionKey, entries: list[ResumeEntry]
) -> tuple[Turn, set[str]]:
    """Decide the thread's open decisions as the resume entries answer them; the turn that
    waited for them, and their ids."""
    scheduler = st.runtime.scheduler
    pending = {d.call_id: d for d in await scheduler.decisions(key, status="pending")}
    answers: dict[str, ResumeEntry] = {}
    for entry in entries:
        if entry.interrupt_id not in pending:
            raise _Refused(
                "interrupt_not_found", f"no open interrupt {entry.interrupt_id!r} on this thread"
            )
        if entry.interrupt_id in answers:
            raise _Refused("invalid_resume", f"interrupt {entry.interrupt_id!r} is answered twice")
        answers[entry.interrupt_id] = entry
    # A session's turns run one at a time, and a parked turn holds the rest: one turn waits.
    turns = {pending[i].turn_id for i in answers}
    if len(turns) != 1:
        raise _Refused("invalid_resume", "the answers name interrupts of several turns")
    (turn_id,) = turns
    missing = [c for c, d in pending.items() if d.turn_id == turn_id and c not in answers]
    if missing:
        raise _Refused("invalid_resume", f"a resume answers every open interrupt: {missing}")
    verdicts = {c: _verdict(pending[c], e) for c, e in answers.items()}
    for call_id, (verdict, answer) in verdicts.items():
        await scheduler.decide(
            key, turn_id, call_id, verdict, answer=answer, by=caller.user, principal=caller
        )
    turn = await st.runtime.sessions.turn(key, turn_id)
    if turn is None:  # deleted between the two reads
        raise _Refused("interrupt_not_found", "the turn that asked is gone")
    return turn, set(answers)


def _verdict(decision: Decision, entry: ResumeEntry) -> tuple[Verdict, str | None]:
    """The decision a resume entry makes: ``cancelled`` refuses; a question takes its answer
    (``{"answer": ...}`` or a string), an approval ``{"decision": ...}`` or a boolean."""
    if entry.status == "cancelled":
        return "deny", None
    payload = entry.payload
    if decision.kind == "question":
        if isinstance(payload, dict):
            payload = payload.get("answer")
        if isinstance(payload, str):
            return "answer", payload
        raise _Refused(
            "invalid_resume",
            f'interrupt {entry.interrupt_id!r} asks a question: its payload is {{"answer": "..."}}',
        )
    if isinstance(payload, dict):
        payload = payload.get("decision", payload.get("approved"))
    if isinstance(payload, bool):
        return ("approve" if payload else "deny"), None
    if payload in ("approve", "deny", "always"):
        verdict: Verdict = payload
        return verdict, None
    raise _Refused(
        "invalid_resume",
        f"interrupt {entry.interrupt_id!r} asks for an approval: its payload is "
        '{"decision": "approve" | "deny" | "always"}',
    )
