"""The model seam: what the turn loop sends a model and what streams back.

A provider implements :class:`Model`. It never sees sessions, stores or tools' code: only a
:class:`ModelRequest` of plain messages and tool schemas, answered by a stream of
:data:`ModelEvent` values. Errors are raised as :class:`tether.errors.ModelError`, with
``transient=True`` for the ones worth retrying (the loop owns the retry policy).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call requested by the model."""

    id: str
    name: str
    arguments: str
    """JSON text of the arguments, exactly as the model produced it."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message of a request, in the OpenAI chat shape."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """Only on assistant messages."""
    tool_call_id: str | None = None
    """Only on tool messages: the call this result answers."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON schema of the arguments object."""


@dataclass(frozen=True, slots=True)
class ModelRequest:
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_output_tokens: int | None = None
    temperature: float | None = None
    """None means the provider's deterministic default (greedy for ``local``)."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call; pieces with the same ``index`` belong to one call."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "other"]


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason


ModelEvent = TextDelta | ToolCallDelta | Usage | Finish


@runtime_checkable
class Model(Protocol):
    """What the turn loop needs of a model."""

    @property
    def name(self) -> str:
        """A label for logs and turn records, e.g. ``openai:gpt-4o-mini``."""
        ...

    @property
    def context_window(self) -> int:
        """Tokens the model accepts in one request (prompt plus output)."""
        ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        """Stream the answer to ``request``.

        Implementations are async generators. Cancellation (the consumer stops iterating or its
        task is cancelled) must release the provider's resources promptly.
        """
        ...
