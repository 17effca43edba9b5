"""Deterministic models for tests: scripted replies, tool calls, failures and slow streams.

Each model records every request it receives (``model.requests``), so a test can assert exactly
what a turn sent — which history, in which order, and that nothing of another session leaked.

A :class:`ScriptedModel` called once more than its script holds raises
:class:`~tether.errors.ScriptExhausted` rather than making an answer up: a test that did not
expect the extra call then fails where it happened. Tests that want some answer to every call
say so, with ``default=`` (:func:`reply_to`, :func:`echo_responder`, a fixed response, ...).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tether.errors import ModelError, ScriptExhausted
from tether.models.base import (
    Finish,
    Message,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
)


@dataclass(frozen=True)
class Call:
    """A tool call the scripted model makes."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


@dataclass(frozen=True)
class ToolCalls:
    """One model step that calls tools (optionally with some text first)."""

    calls: tuple[Call, ...]
    text: str = ""

    def __init__(self, *calls: Call, text: str = "") -> None:
        object.__setattr__(self, "calls", calls)
        object.__setattr__(self, "text", text)


@dataclass(frozen=True)
class Fail:
    """Raise a ModelError (``transient`` ones are retried by the loop)."""

    message: str = "scripted failure"
    transient: bool = True
    status: int | None = 500


@dataclass(frozen=True)
class Slow:
    """Stream ``text`` one word at a time, ``delay`` seconds apart; ``forever`` never finishes."""

    text: str = "this reply takes a while to arrive"
    delay: float = 0.05
    forever: bool = False


Response = str | ToolCalls | Fail | Slow
Responder = Callable[[ModelRequest], Response]


def last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message.role == "user":
            return message.content
    return ""


def reply_to(request: ModelRequest) -> str:
    """``"reply to: <last user message>"``: a ``default=`` for tests that need only some answer."""
    return f"reply to: {last_user_text(request)}"


class ScriptedModel:
    """Answers with the next scripted response, then ``default``, then raises.

    ``default`` may be a response or a function of the request, and answers every call after
    the script is used up. Without one, such a call raises :class:`ScriptExhausted` (not
    transient, so the turn fails with ``model_error`` at once instead of being retried). Text is
    streamed a word at a time so consumers see real deltas.
    """

    def __init__(
        self,
        *responses: Response,
        default: Response | Responder | None = None,
        context_window: int = 8192,
        name: str = "scripted",
        delay: float = 0.0,
    ) -> None:
        self._script: deque[Response] = deque(responses)
        self._scripted = len(responses)  # every response ever scripted, for the error message
        self._default = default
        self._lock = threading.Lock()
        self._context_window = context_window
        self._name = name
        self.delay = delay
        """Seconds to wait before answering (simulated model latency)."""
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int:
        return self._context_window

    def script(self, *responses: Response) -> None:
        with self._lock:
            self._script.extend(responses)
            self._scripted += len(responses)

    def _next(self, request: ModelRequest) -> Response:
        with self._lock:
            self.requests.append(request)
            if self._script:
                return self._script.popleft()
            scripted, call = self._scripted, len(self.requests)
        if self._default is None:
            responses = "response" if scripted == 1 else "responses"
            raise ScriptExhausted(
                f"ScriptedModel {self._name!r} got call {call} but its script had {scripted}"
                f" {responses}; pass default= (a response, or a function of the request such as"
                " tether.testing.reply_to) to answer further calls"
            )
        if callable(self._default):
            return self._default(request)
        return self._default

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        response = self._next(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        prompt_tokens = sum(len(m.content.split()) + 1 for m in request.messages)
        if isinstance(response, Fail):
            raise ModelError(response.message, transient=response.transient, status=response.status)
        if isinstance(response, ToolCalls):
            for word in _words(response.text):
                yield TextDelta(word)
            for index, call in enumerate(response.calls):
                yield ToolCallDelta(
                    index,
                    call.id or f"call_{index}_{id(call):x}",
                    call.name,
                    json.dumps(call.arguments),
                )
            yield Usage(prompt_tokens, len(response.calls) * 8)
            yield Finish("tool_calls")
            return
        if isinstance(response, Slow):
            words = _words(response.text)
            while True:
                for word in words:
                    await asyncio.sleep(response.delay)
                    yield TextDelta(word)
                if not response.forever:
                    break
            yield Usage(prompt_tokens, len(words))
            yield Finish("stop")
            return
        words = _words(response)
        for word in words:
            yield TextDelta(word)
        yield Usage(prompt_tokens, len(words))
        yield Finish("stop")


def _words(text: str) -> list[str]:
    """Split into streamable pieces that join back to exactly ``text``."""
    if not text:
        return []
    parts = text.split(" ")
    return [p + " " for p in parts[:-1]] + [parts[-1]]


def echo_responder(request: ModelRequest) -> str:
    """Reply with a transcript of the prompt, so assertions can read what the model saw."""
    return " | ".join(f"{m.role}:{m.content}" for m in request.messages if m.role != "system")


class EchoModel(ScriptedModel):
    """Replies with a transcript of every non-system message it was sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(default=echo_responder, **kwargs)


def transcript(messages: Iterable[Message]) -> list[tuple[str, str]]:
    """``(role, content)`` pairs of a request's messages, for compact assertions."""
    return [(m.role, m.content) for m in messages]
