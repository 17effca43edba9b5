"""Runs: each one a turn of the thread's session, submitted through the shared conversation step.

Only the last human message of ``input.messages`` is the turn's input: the thread's history is
tether's, so a client that sends the whole conversation again does not duplicate it.
``multitask_strategy`` is the turn's policy (default ``reject``, as LangGraph's: a thread with
a run under way answers 409); ``if_not_exists: create`` makes the thread. Background runs
answer with the run; ``/wait`` and ``/join`` with the thread's ``values`` as the run left them
(``{"__error__": {error, message}}`` for a failed run, and ``__interrupt__`` beside the
messages while it waits for a human); ``/stream`` with its events (:mod:`._stream`), resumable
with ``Last-Event-ID`` through ``GET …/runs/{run_id}/stream``, which the ``Location`` header
names. A stateless run (``/runs``, ``/runs/wait``, ``/runs/stream``) runs on a thread of its own,
deleted when the run ends unless ``on_completion`` is ``keep``.

A run with ``command: {"resume": …}`` answers what the thread's parked turn asks, and that
same run goes on (:mod:`._resume`); its stream picks up where the interrupted one stopped.

Refused rather than ignored, since ignoring them would change what the run does:
``interrupt_before``/``interrupt_after``, ``after_seconds``, ``webhook``, ``checkpoint``,
``command`` other than ``resume``, and cancelling with ``action=rollback``. ``config``,
``context``, ``metadata``, ``stream_subgraphs``, ``stream_resumable`` (every run's stream can be
resumed) and the like are accepted and have no effect.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Header, Query, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from tether.errors import NotFound, SessionNotFound
from tether.records import Principal, SessionKey, Turn
from tether.server.conversation import open_session, send, submit
from tether.server.deps import State, check_message
from tether.server.faces.langgraph._common import (
    Caller,
    body_of,
    own_thread,
    thread_key,
)
from tether.server.faces.langgraph._errors import LangGraphError, LangGraphRoute, invalid, not_found
from tether.server.faces.langgraph._resume import resume, resumed_after, waits_for_human
from tether.server.faces.langgraph._spec import RunSpec, run_spec
from tether.server.faces.langgraph._state import all_turns, messages_through
from tether.server.faces.langgraph._stream import RunInfo, resume_point, run_stream, stream_modes
from tether.server.faces.langgraph._wire import interrupt_of, run_out, run_status
from tether.server.routes.turns import wait_for_turn
from tether.server.state import ServerState

router = APIRouter(route_class=LangGraphRoute)

_ALL = 999_999
"""A frame index past every frame of one event: resume after all of them."""


async def _start(
    st: ServerState, request: Request, caller: Principal, thread_id: str | None
) -> tuple[RunInfo, RunSpec, tuple[int, int]]:
    """Submit the run's turn (or resume the parked one); also where its new stream starts."""
    spec = run_spec(st, await body_of(request))
    if spec.command is not None:
        if thread_id is None:
            raise invalid("a command resumes a thread's run: name the thread")
        record = await own_thread(st, caller, thread_id)
        turn = await resume(st, caller, record.key, spec.command)
        after = (await resumed_after(st, turn), _ALL)
        return RunInfo(record.key, turn, spec.agent.name), spec, after
    assert spec.text is not None
    if thread_id is None:  # a stateless run: a session of its own, made first
        opened = await open_session(
            st, caller, str(uuid.uuid4()), spec.agent.name, message=spec.text
        )
        turn = await submit(st, opened, caller, spec.text, policy=spec.policy)
        return RunInfo(opened.key, turn, spec.agent.name), spec, (-1, 0)
    key = thread_key(caller, str(thread_id))
    check_message(st, spec.text)  # its size first, as before anything is read
    if spec.policy == "reject":
        await _refuse_if_waiting(st, key)
    try:
        # The admission finds the thread's session; with if_not_exists=create, one that is
        # not there (or expired) is made and the run sent again.
        turn = await send(
            st,
            caller,
            key.session_id,
            spec.text,
            spec.agent.name,
            create=spec.create,
            policy=spec.policy,
        )
    except SessionNotFound:
        raise not_found("thread", key.session_id) from None
    return RunInfo(key, turn, spec.agent.name), spec, (-1, 0)


async def _refuse_if_waiting(st: ServerState, key: SessionKey) -> None:
    """Busy, but with nothing running: say what it waits for, not "a turn is running"."""
    try:
        waiting = await st.runtime.scheduler.decisions(key, status="pending", limit=1)
    except SessionNotFound:
        return  # no thread yet: the run makes it, or finds no thread
    record = await st.runtime.sessions.get(key) if waiting else None
    if waiting and record is not None and not record.expired():
        raise LangGraphError(
            409,
            f"the thread waits for an answer to interrupt {waiting[0].call_id}: resume it "
            '(command={"resume": ...}) first; this run was not started',
            "awaiting_input",
        )


def _headers(
    request: Request, run: RunInfo, follow: str | None, modes: frozenset[str] = frozenset()
) -> dict[str, str]:
    """``Content-Location`` (the run) and, for a thread that outlives the run, ``Location``:
    where a client whose response was cut off picks it up (``join``, or the stream with the
    same modes). Absolute: the SDKs resolve a path against their base URL, ``/lg`` included."""
    ids = {"thread_id": run.thread_id, "run_id": run.turn.id}
    headers = {"Content-Location": str(request.url_for("lg_get_run", **ids))}
    if follow is not None:
        url = request.url_for(follow, **ids)
        if modes:
            url = url.replace(query=urlencode([("stream_mode", m) for m in sorted(modes)]))
        headers["Location"] = str(url)
    return headers


async def _output(st: ServerState, key: SessionKey, turn: Turn) -> dict[str, Any]:
    """What ``wait``/``join`` answer: the values the run left, or its error."""
    if turn.status in ("failed", "limit_reached"):
        reason = turn.reason or turn.status
        message = turn.error or f"the run ended {turn.status} ({reason})"
        return {"__error__": {"error": reason, "message": message}}
    out: dict[str, Any] = {"messages": await messages_through(st, key, turn)}
    if turn.status == "awaiting_input":
        asked = await st.runtime.scheduler.decisions(key, turn_id=turn.id, status="pending")
        out["__interrupt__"] = [interrupt_of(d) for d in asked]
    return out


async def _discard_after_end(st: ServerState, key: SessionKey, turn_id: str) -> None:
    """A stateless run's thread goes when its run has ended."""
    with contextlib.suppress(NotFound):
        await st.runtime.scheduler.wait(key, turn_id)
        await st.runtime.sessions.delete(key)


def _sse(
    st: ServerState,
    run: RunInfo,
    modes: frozenset[str],
    after: tuple[int, int],
    on_disconnect: str,
    headers: dict[str, str],
    temporary: bool = False,
    *,
    metadata: bool = False,
) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        finished = False
        try:
            with contextlib.suppress(NotFound):  # the thread was deleted meanwhile
                async for chunk in run_stream(st, run, modes, after, metadata=metadata):
                    yield chunk
            finished = True
        finally:
            if not finished and on_disconnect == "cancel":
                st.spawn(st.runtime.scheduler.cancel(run.key, run.turn.id, "client_disconnected"))
            if temporary:
                st.spawn(_discard_after_end(st, run.key, run.turn.id))

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={**headers, "Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _waited(
    st: ServerState, request: Request, run: RunInfo, on_disconnect: str, headers: dict[str, str]
) -> Response:
    while True:
        done = await wait_for_turn(st, request, run.turn, on_disconnect)
        if done is None:
            return Response(status_code=499)  # nobody is listening any more
        if done.status != "awaiting_input" or await waits_for_human(st, done):
            return JSONResponse(await _output(st, run.key, done), headers=headers)
        await asyncio.sleep(0.05)  # decided a moment ago (resumed): it is about to go on


# -- on a thread -------------------------------------------------------------------------------


@router.post("/threads/{thread_id}/runs")
async def create_run(thread_id: str, request: Request, st: State, caller: Caller) -> JSONResponse:
    """Start a run in the background; answers with the run (``pending``)."""
    run, _, _ = await _start(st, request, caller, thread_id)
    return JSONResponse(
        run_out(run.turn, run.assistant_id), headers=_headers(request, run, "lg_join")
    )


@router.post("/threads/{thread_id}/runs/wait")
async def wait_run(thread_id: str, request: Request, st: State, caller: Caller) -> Response:
    """Start a run and answer with the thread's values once it has ended."""
    run, spec, _ = await _start(st, request, caller, thread_id)
    return await _waited(st, request, run, spec.on_disconnect, _headers(request, run, "lg_join"))


@router.post("/threads/{thread_id}/runs/stream")
async def stream_run(
    thread_id: str, request: Request, st: State, caller: Caller
) -> StreamingResponse:
    """Start a run and stream its events."""
    run, spec, after = await _start(st, request, caller, thread_id)
    headers = _headers(request, run, "lg_join_stream", spec.modes)
    return _sse(st, run, spec.modes, after, spec.on_disconnect, headers, metadata=True)


@router.get("/threads/{thread_id}/runs")
async def list_runs(
    thread_id: str,
    st: State,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0)] = 0,
    status: str | None = None,
) -> JSONResponse:
    """The thread's runs, newest first."""
    record = await own_thread(st, caller, thread_id)
    turns = (await all_turns(st, record.key))[::-1]
    if status:
        turns = [t for t in turns if run_status(t.status) == status]
    return JSONResponse([run_out(t) for t in turns[offset : offset + limit]])


async def _own_run(st: ServerState, caller: Principal, thread_id: str, run_id: str) -> RunInfo:
    record = await own_thread(st, caller, thread_id)
    turn = await st.runtime.sessions.turn(record.key, run_id)
    if turn is None:
        raise not_found("run", run_id)
    return RunInfo(record.key, turn, turn.agent_name)


@router.get("/threads/{thread_id}/runs/{run_id}", name="lg_get_run")
async def get_run(thread_id: str, run_id: str, st: State, caller: Caller) -> JSONResponse:
    run = await _own_run(st, caller, thread_id, run_id)
    return JSONResponse(run_out(run.turn))


@router.post("/threads/{thread_id}/runs/{run_id}/cancel")
async def cancel_run(
    thread_id: str,
    run_id: str,
    st: State,
    caller: Caller,
    wait: bool = False,
    action: str = "interrupt",
) -> Response:
    """Cancel a pending or running run (202; ``wait``: 204 once it has ended)."""
    if action == "rollback":
        raise invalid(
            "action=rollback is not supported: tether keeps every turn; cancel with "
            "action=interrupt, or send the next run with multitask_strategy=rollback"
        )
    if action != "interrupt":
        raise invalid("action must be interrupt")
    run = await _own_run(st, caller, thread_id, run_id)
    cancelling = st.runtime.scheduler.cancel(run.key, run.turn.id, "cancelled")
    if not wait:
        st.spawn(cancelling)
        return Response(status_code=202)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(30):
            await cancelling
    return Response(status_code=204)


@router.get("/threads/{thread_id}/runs/{run_id}/join", name="lg_join")
async def join_run(
    thread_id: str, run_id: str, request: Request, st: State, caller: Caller
) -> Response:
    """Wait for the run's end; the thread's values as the run left them."""
    run = await _own_run(st, caller, thread_id, run_id)
    return await _waited(st, request, run, "continue", {})


@router.get("/threads/{thread_id}/runs/{run_id}/stream", name="lg_join_stream")
async def join_stream(
    thread_id: str,
    run_id: str,
    st: State,
    caller: Caller,
    stream_mode: Annotated[list[str] | None, Query()] = None,
    cancel_on_disconnect: bool = False,
    last_event_id: Annotated[str | None, Header(max_length=64)] = None,
) -> StreamingResponse:
    """The run's events, replayed from its start or after ``Last-Event-ID``, then live."""
    run = await _own_run(st, caller, thread_id, run_id)
    modes = stream_modes([m for m in stream_mode or [] if m])
    after = resume_point(last_event_id)
    on_disconnect = "cancel" if cancel_on_disconnect else "continue"
    return _sse(st, run, modes, after, on_disconnect, {})


# -- stateless ---------------------------------------------------------------------------------


@router.post("/runs")
async def create_stateless_run(request: Request, st: State, caller: Caller) -> JSONResponse:
    run, spec, _ = await _start(st, request, caller, None)
    if not spec.keep:
        st.spawn(_discard_after_end(st, run.key, run.turn.id))
    return JSONResponse(run_out(run.turn, run.assistant_id), headers=_headers(request, run, None))


@router.post("/runs/wait")
async def wait_stateless_run(request: Request, st: State, caller: Caller) -> Response:
    run, spec, _ = await _start(st, request, caller, None)
    try:
        return await _waited(st, request, run, spec.on_disconnect, _headers(request, run, None))
    finally:
        if not spec.keep:
            st.spawn(_discard_after_end(st, run.key, run.turn.id))


@router.post("/runs/stream")
async def stream_stateless_run(request: Request, st: State, caller: Caller) -> StreamingResponse:
    run, spec, _ = await _start(st, request, caller, None)
    headers = _headers(request, run, None)
    return _sse(
        st, run, spec.modes, (-1, 0), spec.on_disconnect, headers, not spec.keep, metadata=True
    )
