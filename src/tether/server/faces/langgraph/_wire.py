"""The face's records in LangGraph's shapes: assistants, runs, interrupts, and their words.

A tether agent is an assistant whose ``assistant_id``, ``graph_id`` and ``name`` are all the
agent's name. A run is a turn (``run_id`` is the turn's id); its status says how the turn
stands: queued ``pending``, ``running``, completed ``success``; cancelled, interrupted or rolled
back by a newer run ``interrupted``; failed or stopped by a limit ``error``; and a turn that
waits for a human decision ``interrupted`` too, with the decision as the thread's interrupt (it
goes on, as the same run, once decided).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from tether.agent import Agent
from tether.records import Decision, Policy, Turn

STARTED = time.time()
"""When this process began serving its assistants (their ``created_at``)."""

_RUN_STATUS = {
    "queued": "pending",
    "running": "running",
    "awaiting_input": "interrupted",
    "completed": "success",
    "cancelled": "interrupted",
    "interrupted": "interrupted",
    "rolled_back": "interrupted",
    "limit_reached": "error",
    "failed": "error",
}

MULTITASK: dict[str, Policy] = {
    "reject": "reject",
    "enqueue": "enqueue",
    "interrupt": "interrupt",
    "rollback": "rollback",
}
"""LangGraph's multitask strategies, and the tether policy each one is."""


def iso(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, UTC).isoformat()


def run_status(status: str) -> str:
    return _RUN_STATUS.get(status, "error")


def assistant_out(agent: Agent) -> dict[str, Any]:
    return {
        "assistant_id": agent.name,
        "graph_id": agent.name,
        "name": agent.name,
        "description": agent.description or None,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": iso(STARTED),
        "updated_at": iso(STARTED),
    }


def run_out(turn: Turn, assistant_id: str | None = None) -> dict[str, Any]:
    return {
        "run_id": turn.id,
        "thread_id": turn.key.session_id,
        "assistant_id": assistant_id or turn.agent_name,
        "created_at": iso(turn.created_at),
        "updated_at": iso(turn.ended_at or turn.started_at or turn.created_at),
        "status": run_status(turn.status),
        "metadata": {},
        "multitask_strategy": turn.policy,
        "kwargs": {"input": {"messages": [{"type": "human", "content": turn.input}]}},
    }


def interrupt_of(decision: dict[str, Any] | Decision) -> dict[str, Any]:
    """A decision a turn waits for, as a LangGraph interrupt (``{"value", "id"}``)."""
    if isinstance(decision, Decision):
        data: dict[str, Any] = {
            "turn_id": decision.turn_id,
            "call_id": decision.call_id,
            "kind": decision.kind,
            "payload": decision.payload,
            "deadline": decision.deadline,
        }
    else:
        data = {k: decision.get(k) for k in ("turn_id", "call_id", "kind", "payload", "deadline")}
    return {"value": data, "id": str(data["call_id"])}
