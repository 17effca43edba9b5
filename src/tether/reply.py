"""A chat reply as the remote-agent contract has it: text that also answers by key."""

from __future__ import annotations

import time
from typing import Any

from tether.records import Turn


class Response(str):
    """A chat reply: the text itself (a ``str``), and as the remote-agent contract has it,
    ``response["content"]`` and ``response["metadata"]`` (``agent_name``, ``session_id``,
    ``turn_id``, ``timestamp``, ``status``); ``response.turn`` is the turn's id, and
    ``response.complete`` False when the reply was cut short at the output limit."""

    metadata: dict[str, Any]
    complete: bool

    def __new__(cls, content: str, metadata: dict[str, Any], complete: bool = True) -> Response:
        made = super().__new__(cls, content)
        made.metadata = metadata
        made.complete = complete
        return made

    @classmethod
    def of_reply(cls, reply: dict[str, Any], text: str) -> Response:
        """From ``/api/chat``'s answer (``text``: its reply, through the middleware)."""
        return cls(
            text,
            {
                "agent_name": reply.get("agent_name"),
                "session_id": reply.get("session_id"),
                "turn_id": reply.get("turn_id"),
                "timestamp": time.time(),
                "status": "completed",
            },
            reply.get("complete") is not False,
        )

    @classmethod
    def of_turn(cls, turn: Turn, text: str | None = None) -> Response:
        """From an ended turn (``text``: its reply, through a session's middleware). The agent
        named is the one that answered (after any handoff)."""
        return cls(
            turn.output or "" if text is None else text,
            {
                "agent_name": turn.agent_name,
                "session_id": turn.key.session_id,
                "turn_id": turn.id,
                "timestamp": turn.ended_at or time.time(),
                "status": turn.status,
            },
            turn.complete,
        )

    def passed_through(self, text: str) -> Response:
        """The same reply with the text a middleware made of it."""
        return Response(text, dict(self.metadata), self.complete)

    @property
    def content(self) -> str:
        return str(self)

    @property
    def turn(self) -> str | None:
        turn_id = self.metadata.get("turn_id")
        return str(turn_id) if turn_id is not None else None

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key == "content":
                return str(self)
            if key == "metadata":
                return self.metadata
            raise KeyError(key)
        return str.__getitem__(self, key)  # an index or a slice: the text's
