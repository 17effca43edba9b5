"""Chat messages in the OpenAI wire shape, and a conversation's prompt encoded once as it grows.

A long conversation's prompt is mostly the prompt of its previous turn: the window memo
(:class:`~tether.loop.window.ItemMemo`) hands out the very same :class:`Message` objects turn
after turn, with the turn before's messages added at the end (and, once the window is full,
the oldest taken off the front). :class:`Encoded` keeps the JSON of the run of messages it
last sent for each conversation, finds it again by the identity of the run's last message,
checks that the prompt holds the same objects, and encodes only what is new: the request body
costs what was written since, not a walk over every message (at 600 messages, building and
encoding each one was ~0.2 ms a turn, growing with the session).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from openai.types.chat import ChatCompletionMessageParam

from tether.errors import ModelError
from tether.models.base import Message

MAX_BYTES = 64 * 1024 * 1024
"""Memory the runs may keep, across every conversation of a model, in two generations of half
that each: runs are made in the young one, and one found in the old one moves to the young one;
when the young one is full it becomes the old one and the old one is dropped. A conversation
that sends nothing for a generation is encoded afresh on its next turn. What a run keeps is
counted as twice its JSON (the JSON, and the messages' text it holds alive) and
:data:`PER_MESSAGE` for each message."""
PER_MESSAGE = 200
"""Bytes a run keeps alive for each message besides its text: the message object, its place in
the run's list, its offset."""
PROBE = 64
"""How far back from a prompt's end a remembered run's last message is looked for: a turn adds
its input, its reply, a message for each step's calls and one for each call's result."""


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


def encode(message: Message) -> bytes:
    return orjson.dumps(to_openai(message))


@dataclass(slots=True)
class _Run:
    """Messages sent one after another, and their JSON joined by commas."""

    messages: list[Message]
    joined: bytes
    starts: list[int]
    """Where each message's JSON starts, counted from ``origin``."""
    origin: int = 0
    """The count at which ``joined`` starts (a run made from another's tail keeps its counts)."""


class Encoded:
    """Prompts as JSON arrays, each conversation's remembered as a run of messages.

    A run holds its messages alive, so while it is filed under its last message's ``id`` no
    other object can have that id; and a run is used only for a prompt that holds its very
    message objects, in order. The prompt's leading system messages and its last message (this
    turn's input, which the next turn renders from history as another object) are never part of
    a run."""

    __slots__ = ("_bytes", "_old", "_young")

    def __init__(self) -> None:
        self._young: dict[int, _Run] = {}
        self._old: dict[int, _Run] = {}
        self._bytes = 0
        """Of the young generation."""

    def __len__(self) -> int:
        """Runs remembered."""
        return len(self._young.keys() | self._old.keys())

    def array(self, messages: Sequence[Message]) -> orjson.Fragment:
        """``messages`` as one JSON array, ready for ``orjson.dumps``."""
        # The leading system messages (the instructions with this turn's recall, the summary of
        # what fell out of the window) are made anew each turn: never part of a run.
        lead = 0
        while lead < len(messages) and messages[lead].role == "system":
            lead += 1
        tail = len(messages) - 1
        if tail <= lead:
            return orjson.Fragment(b"[" + b",".join(map(encode, messages)) + b"]")
        found = self._find(messages, lead, tail)
        if found is None:
            run = self._run(messages[lead:tail])
        else:
            old, count = found
            run = self._extend(old, count, messages[lead + count : tail])
        self._keep(run)
        lead_json = [part for m in messages[:lead] for part in (encode(m), b",")]
        return orjson.Fragment(
            b"".join([b"[", *lead_json, run.joined, b",", encode(messages[tail]), b"]"])
        )

    def _find(self, messages: Sequence[Message], lead: int, tail: int) -> tuple[_Run, int] | None:
        """A remembered run that ends with ``messages[lead:lead + count]`` (the very objects;
        the messages after them, up to ``tail``, are new), and that ``count``; the run is no
        longer filed (the caller files the longer one it makes of it)."""
        for end in range(tail - 1, max(lead, tail - PROBE) - 1, -1):
            key = id(messages[end])
            run = self._young.get(key) or self._old.get(key)
            if run is None:
                continue
            count, held = end + 1 - lead, len(run.messages)
            if count <= held and all(
                map(
                    operator.is_,
                    itertools.islice(run.messages, held - count, held),
                    itertools.islice(messages, lead, end + 1),
                )
            ):
                if self._young.pop(key, None) is not None:
                    self._bytes -= _held(run)
                self._old.pop(key, None)
                return run, count
        return None

    @staticmethod
    def _run(messages: Sequence[Message]) -> _Run:
        encoded = list(map(encode, messages))
        starts = list(itertools.accumulate((len(e) + 1 for e in encoded[:-1]), initial=0))
        return _Run(list(messages), b",".join(encoded), starts)

    @staticmethod
    def _extend(run: _Run, count: int, added: Sequence[Message]) -> _Run:
        """The last ``count`` messages of ``run``, then ``added``."""
        held = len(run.messages)
        first = run.starts[held - count]
        encoded = list(map(encode, added))
        starts = run.starts[held - count :]
        if encoded:
            end = run.origin + len(run.joined)  # where the comma before added[0] goes
            starts += itertools.accumulate((len(e) + 1 for e in encoded[:-1]), initial=end + 1)
        joined = b",".join([memoryview(run.joined)[first - run.origin :], *encoded])
        return _Run(run.messages[held - count :] + list(added), joined, starts, first)

    def _keep(self, run: _Run) -> None:
        key = id(run.messages[-1])
        replaced = self._young.pop(key, None)
        if replaced is not None:  # another prompt's run that ended with the same message
            self._bytes -= _held(replaced)
        if self._bytes + _held(run) > MAX_BYTES // 2:
            self._old, self._young, self._bytes = self._young, {}, 0
        self._young[key] = run
        self._bytes += _held(run)


def _held(run: _Run) -> int:
    return 2 * len(run.joined) + PER_MESSAGE * len(run.messages)
