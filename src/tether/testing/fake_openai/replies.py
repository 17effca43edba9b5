"""What a test scripts the fake server to answer: text, tool calls, errors, cut streams.

These are the fake's whole vocabulary; a reply function (``FakeOpenAIServer(reply=...)``)
returns one of them for each chat request the script does not cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True, slots=True)
class FakeToolCall:
    """Answer with a call of tool ``name``; ``arguments`` is the JSON text, streamed in pieces."""

    name: str
    arguments: str = "{}"
    id: str | None = None
    """The call id; ``None`` gives ``call_<n>`` from a per-server counter."""


@dataclass(frozen=True, slots=True)
class FakeError:
    """Answer with an OpenAI-shaped error body and HTTP ``status``.

    Scripted, it is served ``times`` times before the script moves on; returned by a reply
    function, it is served each time the function returns it.
    """

    status: int = 500
    message: str = "fake server error"
    times: int = 1


@dataclass(frozen=True, slots=True)
class FakeCut:
    """Stream ``text`` and end the response without a finish reason or ``[DONE]``.

    What a client sees when a proxy or a crashing server drops the stream mid-answer.
    """

    text: str = "partial answer"


@dataclass(frozen=True, slots=True)
class FakeLength:
    """Answer ``text`` with finish reason ``length``: a reply cut at the output cap."""

    text: str = "a reply cut short"


FakeReply: TypeAlias = (
    str | FakeToolCall | tuple[FakeToolCall, ...] | FakeError | FakeCut | FakeLength
)
"""Text, one tool call, parallel tool calls, an error, or a cut stream."""

ReplyFunction: TypeAlias = Callable[[dict[str, Any]], FakeReply]
"""Called with the chat request body (on the server's thread) whenever the script is empty."""


def echo_reply(body: dict[str, Any]) -> FakeReply:
    """The default reply: ``"echo: "`` and the content of the last user message."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # content parts: keep the text ones
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return f"echo: {content}"
    return "echo:"
