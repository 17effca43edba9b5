"""``command: {"resume": …}``: a human's answer to what a turn waits for (LangGraph's interrupt).

A tether turn that asks a human (a tool approval, an ``ask_user`` question) parks: its run is
``interrupted`` and each decision it waits for is an interrupt whose ``id`` is the call's. A run
with ``command.resume`` decides them, and the *same* run goes on (its ``run_id`` is the parked
turn's): the value is the answer for a question (a string, or ``{"answer": …}``), and for an
approval ``true``/``false``, ``"approve"``, ``"deny"`` or ``"always"`` (or ``{"decision": …}``).
With several interrupts waiting, ``resume`` maps interrupt ids to values.
"""

from __future__ import annotations

import asyncio
from typing import Any

from tether.events import TURN_AWAITING_INPUT
from tether.records import Decision, Principal, SessionKey, Turn, Verdict
from tether.server.faces.langgraph._errors import LangGraphError, invalid
from tether.server.state import ServerState

_APPROVAL: dict[object, Verdict] = {True: "approve", False: "deny"}
_WORDS: tuple[Verdict, ...] = ("approve", "deny", "always")


def _verdict(decision: Decision, value: object) -> tuple[Verdict, str | None]:
    if isinstance(value, dict):
        if isinstance(value.get("answer"), str):
            return "answer", str(value["answer"])
        value = value.get("decision", value.get("approve"))
    if decision.kind == "question":
        if value == "deny":
            return "deny", None
        if isinstance(value, str):
            return "answer", value
        raise invalid("a question is resumed with its answer (a string)")
    if isinstance(value, bool):
        return _APPROVAL[value], None
    if isinstance(value, str) and value in _WORDS:
        return value, None
    raise invalid("an approval is resumed with true, false, approve, deny or always")


def _answers(waiting: list[Decision], value: object) -> dict[str, object]:
    ids = {d.call_id for d in waiting}
    if isinstance(value, dict) and value and set(value) <= ids:
        return dict(value)
    if len(waiting) == 1:
        return {waiting[0].call_id: value}
    raise invalid("several interrupts wait: resume with {interrupt id: value, …}")


async def resume(
    st: ServerState, caller: Principal, key: SessionKey, command: dict[str, Any]
) -> Turn:
    """Decide what the thread's parked turn waits for; returns that turn (about to go on)."""
    if set(command) != {"resume"}:
        raise invalid("only command.resume is supported (goto and update are not)")
    scheduler = st.runtime.scheduler
    waiting = await scheduler.decisions(key, status="pending")
    if not waiting:
        raise LangGraphError(409, "no interrupt waits on this thread", "nothing_to_resume")
    answers = _answers(waiting, command["resume"])
    decided = [(d, _verdict(d, answers[d.call_id])) for d in waiting if d.call_id in answers]
    for decision, (verdict, answer) in decided:
        await scheduler.decide(
            key,
            decision.turn_id,
            decision.call_id,
            verdict,
            answer=answer,
            by=caller.user,
            principal=caller,
        )
    turn = await st.runtime.sessions.turn(key, waiting[0].turn_id)
    assert turn is not None  # its decisions were just read under the same key
    return turn


async def waits_for_human(st: ServerState, turn: Turn) -> bool:
    """Whether ``turn`` waits for a human now: parked with a decision still pending (a turn
    decided a moment ago is parked until a worker takes it up again)."""
    if turn.status != "awaiting_input":
        return False
    return bool(await st.runtime.scheduler.decisions(turn.key, turn_id=turn.id, status="pending"))


async def parked_on(st: ServerState, key: SessionKey, turn_id: str, call_id: str) -> bool:
    """Whether the turn still waits for the decision on ``call_id`` that a
    ``turn.awaiting_input`` event announced.

    The event reaches a live stream just before the transaction that parks the turn (and
    stores the decision) commits: until the decision is there, look again shortly; once it is,
    the turn waits while it is pending.
    """
    for _ in range(250):
        asked = await st.runtime.scheduler.decisions(key, turn_id=turn_id)
        mine = next((d for d in asked if d.call_id == call_id), None)
        if mine is not None:
            return mine.pending
        await asyncio.sleep(0.02)
    return False


async def resumed_after(st: ServerState, turn: Turn) -> int:
    """The seq of the turn's last ``turn.awaiting_input``: a resumed run streams from there."""
    sessions, last, seq = st.runtime.sessions, 0, 0
    while True:
        page = await sessions.stored_events(turn.key, turn.id, after_seq=seq, limit=1000)
        last = next((e.seq for e in reversed(page) if e.type == TURN_AWAITING_INPUT), last)
        if len(page) < 1000:
            return last
        seq = page[-1].seq
