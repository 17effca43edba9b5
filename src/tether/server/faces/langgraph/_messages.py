"""The ``messages`` state of a thread, as LangChain message dicts (``type`` human, ai, tool).

A turn's messages are built two ways that must agree: from its stored items (a thread's
state, its history) and from its events as they come (a run's stream). Both feed the same
:class:`TurnMessages`, so a message gets the same id either way — ``<turn id>-<n>``, ``n`` its
place among the turn's messages — and a client that merges streamed messages into the state it
fetched later (by id, as LangGraph's clients do) sees each message once.

History items a model never reads again — a summary written by compaction, the record of a
handoff — are no messages; nor are the items of a turn that failed or was rolled back
(``excluded``): the state shows what the next turn builds on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tether.records import Item

Message = dict[str, Any]


def message_id(turn_id: str, n: int) -> str:
    return f"{turn_id}-{n}"


def _base(kind: str, mid: str, content: str) -> Message:
    return {
        "type": kind,
        "content": content,
        "id": mid,
        "name": None,
        "additional_kwargs": {},
        "response_metadata": {},
    }


def human(mid: str, content: str) -> Message:
    return {**_base("human", mid, content), "example": False}


def ai(mid: str, content: str) -> Message:
    return {
        **_base("ai", mid, content),
        "example": False,
        "tool_calls": [],
        "invalid_tool_calls": [],
        "usage_metadata": None,
    }


def tool(mid: str, content: str, call_id: str, name: str, error: bool) -> Message:
    return {
        **_base("tool", mid, content),
        "name": name,
        "tool_call_id": call_id,
        "status": "error" if error else "success",
        "artifact": None,
    }


def chunk_of(message: Message, content: str | None = None) -> Message:
    """``message`` as the chunk a model stream yields (``AIMessageChunk``), optionally with
    only ``content`` (a token's worth) rather than its whole text."""
    out = {**message, "type": "AIMessageChunk"}
    if content is not None:
        out["content"] = content
    out["tool_call_chunks"] = [
        {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": n}
        for n, c in enumerate(message.get("tool_calls", []))
    ]
    return out


def _add_call(message: Message, call_id: str, name: str, arguments: str) -> None:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = None
    if isinstance(args, dict):
        message["tool_calls"].append(
            {"name": name, "args": args, "id": call_id, "type": "tool_call"}
        )
    else:
        message["invalid_tool_calls"].append(
            {
                "name": name,
                "args": arguments,
                "id": call_id,
                "error": "the arguments are not a JSON object",
                "type": "invalid_tool_call",
            }
        )


class TurnMessages:
    """The messages one turn adds, in order, fed from its items or from its events.

    A model step's text and the tool calls it made are one AI message: it stays open for
    calls until anything else comes (a result, another step's text, the turn's end).
    """

    def __init__(self, turn_id: str) -> None:
        self.turn_id = turn_id
        self.messages: list[Message] = []
        self._open: Message | None = None

    def _next_id(self) -> str:
        return message_id(self.turn_id, len(self.messages))

    def next_ai_id(self) -> str:
        """The id the AI message a model is streaming now will have."""
        return self._next_id()

    def close(self) -> Message | None:
        """End the open AI message; returns it (None when none was open)."""
        done, self._open = self._open, None
        return done

    def add_human(self, text: str) -> Message:
        self.close()
        message = human(self._next_id(), text)
        self.messages.append(message)
        return message

    def add_text(self, text: str, complete: bool = True) -> Message:
        self.close()
        message = ai(self._next_id(), text)
        # LangChain's word for a reply cut short (at the output cap, or by a cancel): "length";
        # ``complete`` says it outright, as tether's items do.
        message["response_metadata"] = {
            "finish_reason": "stop" if complete else "length",
            "complete": complete,
        }
        self.messages.append(message)
        self._open = message
        return message

    def add_call(self, call_id: str, name: str, arguments: str) -> Message:
        message = self._open if self._open is not None else self.add_text("")
        _add_call(message, call_id, name, arguments)
        return message

    def add_result(self, call_id: str, name: str, output: str, error: bool) -> Message:
        self.close()
        message = tool(self._next_id(), output, call_id, name, error)
        self.messages.append(message)
        return message

    def add_item(self, item: Item) -> None:
        if item.kind == "user":
            self.add_human(item.content)
        elif item.kind == "assistant":
            self.add_text(item.content, item.complete)
        elif item.kind == "tool_call":
            self.add_call(item.call_id or "", item.tool_name or "", item.arguments or "")
        elif item.kind == "tool_result":
            error = bool(item.meta.get("error"))
            self.add_result(item.call_id or "", item.tool_name or "", item.content, error)
        # summary and handoff items are not messages (see the module's docstring)


def messages_of(items: Iterable[Item], turns: Iterable[str] | None = None) -> list[Message]:
    """The messages of ``items`` (a session's, in order), turn by turn; only the turns named in
    ``turns`` when given. Excluded items (failed and rolled-back turns) are left out."""
    wanted = set(turns) if turns is not None else None
    out: list[Message] = []
    current: TurnMessages | None = None
    for item in items:
        if item.excluded or (wanted is not None and item.turn_id not in wanted):
            continue
        if current is None or current.turn_id != item.turn_id:
            if current is not None:
                out.extend(current.messages)
            current = TurnMessages(item.turn_id)
        current.add_item(item)
    if current is not None:
        out.extend(current.messages)
    return out
