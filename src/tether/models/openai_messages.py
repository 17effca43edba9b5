"""Chat messages in the OpenAI wire shape, each encoded once while it is in use.

A long conversation's prompt is mostly the prompt of its previous turn: the window memo
(:class:`~tether.loop.window.ItemMemo`) hands out the very same :class:`Message` objects turn
after turn, so their JSON is remembered by identity and spliced into the request body
(``orjson.Fragment``) rather than built and encoded again: at 600 messages that was ~0.1 ms a
turn, growing with the session.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Sequence
from typing import cast

import orjson
from openai.types.chat import ChatCompletionMessageParam

from tether.errors import ModelError
from tether.models.base import Message

MAX_BYTES = 16 * 1024 * 1024
"""Encoded bytes remembered at most, across every conversation of a model, in two generations
of half that each: entries are made in the young one, and found in the old one they move to
the young one; when the young one is full it becomes the old one and the old one is dropped.
A message nobody sends again (a turn's own input: the next turn renders it from the history as
another object) is gone after two generations; one each turn sends stays."""
LARGEST = 64 * 1024
"""A message encoded to more is not remembered: a few such would crowd out the rest."""


def to_openai(message: Message) -> ChatCompletionMessageParam:
    if message.role == "system":
        return {"role": "system", "content": message.content}
    if message.role == "user":
        return {"role": "user", "content": message.content}
    if message.role == "tool":
        if message.tool_call_id is None:
            raise ModelError("a tool message needs a tool_call_id")
        return {"role": "tool", "content": message.content, "tool_call_id": message.tool_call_id}
    if not message.tool_calls:
        return {"role": "assistant", "content": message.content}
    # OpenAI wants null (not "") content next to tool calls that come without text.
    return {
        "role": "assistant",
        "content": message.content or None,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in message.tool_calls
        ],
    }


class Encoded:
    """Messages' JSON, remembered by the identity of the message object.

    An entry holds its message alive, so while it is filed under a message's ``id`` no other
    object can have that id: finding an entry under ``id(message)`` is finding that message's
    (which is what lets the lookups run in C, with no loop in Python over the prompt). System
    messages (the instructions with this turn's recall, made anew each turn) are never
    remembered."""

    __slots__ = ("_bytes", "_old", "_young")

    def __init__(self) -> None:
        self._young: dict[int, _Entry] = {}
        self._old: dict[int, _Entry] = {}
        self._bytes = 0
        """Of the young generation."""

    def __len__(self) -> int:
        return len(self._young.keys() | self._old.keys())

    def __contains__(self, message: object) -> bool:
        return any(d.get(id(message), (None,))[0] is message for d in (self._young, self._old))

    def __call__(self, messages: Sequence[Message]) -> list[orjson.Fragment]:
        found = list(map(self._young.get, map(id, messages)))
        at = -1
        with contextlib.suppress(ValueError):  # list.index: no None left
            while True:
                at = found.index(None, at + 1)
                found[at] = self._entry(messages[at])
        return list(map(_FRAGMENT, cast("list[_Entry]", found)))

    def _entry(self, message: Message) -> _Entry:
        entry = self._old.get(id(message))
        if entry is None:
            raw = orjson.dumps(to_openai(message))
            entry = (message, orjson.Fragment(raw), len(raw))
            if message.role == "system" or len(raw) > LARGEST:
                return entry
        if self._bytes + entry[2] > MAX_BYTES // 2:
            self._old, self._young, self._bytes = self._young, {}, 0
        self._young[id(message)] = entry
        self._bytes += entry[2]
        return entry


_Entry = tuple[Message, orjson.Fragment, int]
_FRAGMENT = operator.itemgetter(1)
