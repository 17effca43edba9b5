"""A thread's state read from its session: values, status, interrupts, checkpoints, history.

A checkpoint is the state after a turn: ``checkpoint_id`` is that turn's id (the run's), so
``GET …/history`` lists one state per turn that added messages, newest first, each holding
every message up to and including its turn. Nothing here writes: a thread's state changes only
through runs (tether keeps the history; a client cannot rewrite it).
"""

from __future__ import annotations

from typing import Any

from tether.records import Decision, Item, SessionKey, SessionRecord, Turn
from tether.server.faces.langgraph._messages import Message, TurnMessages, messages_of
from tether.server.faces.langgraph._wire import interrupt_of, iso
from tether.server.state import ServerState

_PAGE = 1000


async def all_items(st: ServerState, key: SessionKey) -> list[Item]:
    out: list[Item] = []
    while True:
        page = await st.runtime.sessions.items(key, after=out[-1].seq if out else 0, limit=_PAGE)
        out.extend(page)
        if len(page) < _PAGE:
            return out


async def all_turns(st: ServerState, key: SessionKey) -> list[Turn]:
    out: list[Turn] = []
    while True:
        page = await st.runtime.sessions.turns(key, after=out[-1].seq if out else 0, limit=_PAGE)
        out.extend(page)
        if len(page) < _PAGE:
            return out


async def _messages(st: ServerState, key: SessionKey, turn: Turn, include: bool) -> list[Message]:
    turns = [
        t.id for t in await all_turns(st, key) if t.seq < turn.seq or (include and t.id == turn.id)
    ]
    return messages_of(await all_items(st, key), turns)


async def messages_before(st: ServerState, key: SessionKey, turn: Turn) -> list[Message]:
    """The thread's messages as ``turn`` found them (every earlier turn's)."""
    return await _messages(st, key, turn, include=False)


async def messages_through(st: ServerState, key: SessionKey, turn: Turn) -> list[Message]:
    """The thread's messages as ``turn`` left them (a run's output, whatever came later)."""
    return await _messages(st, key, turn, include=True)


async def pending(st: ServerState, key: SessionKey) -> list[Decision]:
    return await st.runtime.scheduler.decisions(key, status="pending")


async def thread_status(st: ServerState, key: SessionKey) -> str:
    """``interrupted`` while a turn waits for a human, ``busy`` while one is queued or runs,
    ``error`` when the last turn failed, else ``idle``."""
    stats = await st.runtime.sessions.stats(key)
    if stats.status == "awaiting_input":
        return "interrupted"
    if stats.status == "busy":
        return "busy"
    if stats.turns:
        # Turn seqs count from 1, so the last is after ``turns - 1``; read on to the end all
        # the same, and everything should that not hold.
        tail = await st.runtime.sessions.turns(key, after=stats.turns - 1, limit=_PAGE)
        if not tail or len(tail) == _PAGE:
            tail = await all_turns(st, key)
        if tail and tail[-1].status == "failed":
            return "error"
    return "idle"


def _interrupts(decisions: list[Decision]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for d in decisions:
        out.setdefault(d.turn_id, []).append(interrupt_of(d))
    return out


async def thread_out(st: ServerState, record: SessionRecord) -> dict[str, Any]:
    key = record.key
    decisions = await pending(st, key)
    return {
        "thread_id": key.session_id,
        "created_at": iso(record.created_at),
        "updated_at": iso(record.updated_at),
        "metadata": thread_metadata(record),
        "status": await thread_status(st, key),
        "values": {"messages": messages_of(await all_items(st, key))},
        "interrupts": _interrupts(decisions),
    }


def thread_metadata(record: SessionRecord) -> dict[str, Any]:
    """The thread's metadata: the client's, with the graph its runs use by default."""
    return {"graph_id": record.agent, "assistant_id": record.agent, **record.metadata}


def _checkpoint(key: SessionKey, turn_id: str | None) -> dict[str, Any] | None:
    if turn_id is None:
        return None
    return {
        "thread_id": key.session_id,
        "checkpoint_ns": "",
        "checkpoint_id": turn_id,
        "checkpoint_map": None,
    }


def _state(
    key: SessionKey,
    messages: list[Message],
    turn: tuple[str, float] | None,
    parent: str | None,
    decisions: list[Decision],
) -> dict[str, Any]:
    interrupts = [interrupt_of(d) for d in decisions]
    tasks = [
        {
            "id": d.turn_id,
            "name": "tools",
            "error": None,
            "interrupts": [interrupt_of(d)],
            "checkpoint": None,
            "state": None,
            "result": None,
        }
        for d in decisions
    ]
    return {
        "values": {"messages": messages},
        "next": ["tools"] if decisions else [],
        "tasks": tasks,
        "checkpoint": _checkpoint(key, turn[0] if turn else None)
        or {"thread_id": key.session_id, "checkpoint_ns": "", "checkpoint_id": None},
        "metadata": {"source": "loop", "run_id": turn[0] if turn else None},
        "created_at": iso(turn[1]) if turn else None,
        "parent_checkpoint": _checkpoint(key, parent),
        "interrupts": interrupts,
    }


async def history(st: ServerState, key: SessionKey) -> list[dict[str, Any]]:
    """One state per turn that added messages, newest first (the first is the current one)."""
    by_turn: list[tuple[str, float, list[Message]]] = []
    current: TurnMessages | None = None
    for item in await all_items(st, key):
        if item.excluded:
            continue
        if current is None or current.turn_id != item.turn_id:
            current = TurnMessages(item.turn_id)
            by_turn.append((item.turn_id, item.created_at, current.messages))
        current.add_item(item)
        by_turn[-1] = (item.turn_id, item.created_at, current.messages)
    decisions = await pending(st, key)
    states: list[dict[str, Any]] = []
    so_far: list[Message] = []
    parent: str | None = None
    for n, (turn_id, at, messages) in enumerate(by_turn):
        so_far = [*so_far, *messages]
        last = n == len(by_turn) - 1
        states.append(_state(key, so_far, (turn_id, at), parent, decisions if last else []))
        parent = turn_id
    if not states:
        states.append(_state(key, [], None, None, decisions))
    return states[::-1]
