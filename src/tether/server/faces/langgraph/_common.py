"""What every route of the face starts with: the caller, the body, the caller's thread."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Depends, Request

from tether.agent import Agent
from tether.errors import AgentNotFound, InvalidSessionId, SessionNotFound
from tether.records import Principal, SessionKey, SessionRecord
from tether.server.deps import State
from tether.server.faces.langgraph._errors import LangGraphError, invalid, not_found
from tether.server.state import ServerState


async def _caller(request: Request, st: State) -> Principal:
    # The principal every door resolves; LangGraph's SDKs send the key as X-Api-Key, and insist
    # on sending one even to a local server (a placeholder while no key exists).
    return await st.auth.resolve(request, placeholder_keys=True)


Caller = Annotated[Principal, Depends(_caller)]


async def body_of(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise invalid("the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    return body


def thread_key(caller: Principal, thread_id: str) -> SessionKey:
    """The caller's key for ``thread_id``; an id no session can have is a thread not found."""
    try:
        return SessionKey.of(caller, thread_id)
    except InvalidSessionId:
        raise not_found("thread", thread_id) from None


async def own_thread(st: ServerState, caller: Principal, thread_id: str) -> SessionRecord:
    """The caller's thread; unknown, foreign and expired answer the same 404."""
    try:
        return await st.runtime.sessions.own(thread_key(caller, thread_id))
    except SessionNotFound:
        raise not_found("thread", thread_id) from None


def assistant(st: ServerState, assistant_id: object) -> Agent:
    """The agent an ``assistant_id`` (or ``graph_id``) names: its name."""
    if not st.agents:
        raise LangGraphError(422, "this server has no assistants", "no_assistants")
    if not isinstance(assistant_id, str) or not assistant_id:
        raise invalid("assistant_id must name one of this server's assistants")
    try:
        return st.runtime.served(assistant_id)
    except AgentNotFound:
        raise not_found("assistant", assistant_id) from None


def number(body: dict[str, Any], name: str, default: int, high: int) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise invalid(f"{name} must be a whole number from 0 to {high}")
    return value


def contains(superset: dict[str, Any], subset: dict[str, Any]) -> bool:
    """Whether ``superset`` holds every key of ``subset`` with the same value (nested objects
    compared the same way), as LangGraph's metadata filters match."""
    for k, v in subset.items():
        if k not in superset:
            return False
        mine = superset[k]
        if isinstance(v, dict) and isinstance(mine, dict):
            if not contains(mine, v):
                return False
        elif mine != v:
            return False
    return True
