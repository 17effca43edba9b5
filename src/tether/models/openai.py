"""The ``openai`` provider: any OpenAI-compatible chat completions endpoint (OpenAI, Ollama, ...).

The SDK's own retries are off (``max_retries=0``): tether's turn loop owns the retry policy, and
two retry layers would multiply attempts and hide failures. Every SDK error leaves this module as a
:class:`~tether.errors.ModelError` whose ``transient`` flag tells the loop whether to retry.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import httpx2
import openai
from openai.types.chat import ChatCompletionMessageParam

from tether.errors import ConfigError, ModelError
from tether.models.base import (
    Finish,
    FinishReason,
    Message,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from tether.models.guard import ensure_requests_allowed

__all__ = ["OPENAI_BASE_URL", "OpenAIModel"]

OPENAI_BASE_URL = "https://api.openai.com/v1"

_FINISH_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}
# 408 and 409 are retried too: OpenAI documents both as safe to retry (timeouts, lock conflicts).
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_MAX_DETAIL = 300


class OpenAIModel:
    """A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        label: str | None = None,
        timeout: float = 60.0,
        context_window: int = 128_000,
    ) -> None:
        env_base_url = os.environ.get("OPENAI_BASE_URL") or None
        custom_base_url = base_url or env_base_url
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None:
            if custom_base_url is None:
                raise ConfigError(
                    f"model 'openai:{model}' needs an API key: set OPENAI_API_KEY, or set "
                    "OPENAI_BASE_URL to a local OpenAI-compatible server that needs none"
                )
            # Local servers (Ollama, llama.cpp, vLLM) ignore the key, but the SDK insists on one.
            key = "not-needed"
        self.model = model
        self.base_url = (custom_base_url or OPENAI_BASE_URL).rstrip("/")
        self.timeout = timeout
        self._api_key = key
        self._name = label or f"openai:{model}"
        self._context_window = context_window
        # OpenAI itself wants max_completion_tokens (reasoning models reject max_tokens), while
        # compatible servers have long understood only max_tokens.
        self._official = custom_base_url is None
        self._client: openai.AsyncOpenAI | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int:
        return self._context_window

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r}, label={self._name!r})"

    def _get_client(self) -> openai.AsyncOpenAI:
        # The client's connection pool is bound to the event loop it first ran on; an instance is
        # shared process-wide (resolve_model), so a new loop (e.g. a later asyncio.run) gets a new
        # client instead of pooled connections from a dead loop.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._client = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,
            )
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client and its pooled connections; the next ``stream`` opens a new one."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None:
            await client.close()

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [_to_openai(m) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        limit = request.max_output_tokens
        if limit is not None:
            body["max_completion_tokens" if self._official else "max_tokens"] = limit
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        ensure_requests_allowed(self._name)
        client = self._get_client()
        body = self._body(request)
        # The SDK does the HTTP (auth, base URL, timeouts, status errors), but the body is
        # already in wire shape and the chunks are read as plain JSON: its per-request
        # parameter transform and per-chunk model objects cost several ms of CPU a turn.
        try:
            response = await client.post(
                "/chat/completions", body=body, cast_to=httpx2.Response, stream=True
            )
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc

        usage: Usage | None = None
        finish: FinishReason | None = None
        try:
            async for line in response.aiter_lines():
                chunk = self._chunk(line)
                if chunk is None:
                    continue
                usage = _usage(chunk) or usage  # some servers repeat running totals: last wins
                for choice in chunk.get("choices") or ():
                    if choice.get("index", 0) != 0:
                        continue  # only one choice (n=1) is ever requested
                    for event in _deltas(choice):
                        yield event
                    reason = choice.get("finish_reason")
                    if reason is not None:
                        finish = _FINISH_REASONS.get(reason, "other")
        except httpx2.TimeoutException as exc:
            raise ModelError(f"{self._name}: the stream timed out", transient=True) from exc
        except httpx2.TransportError as exc:
            raise ModelError(
                f"{self._name}: the connection broke mid-answer: {type(exc).__name__}",
                transient=True,
            ) from exc
        finally:
            # However the generator ends (exhausted, failed, closed by a consumer that stopped
            # iterating), the response is closed and its connection released.
            await response.aclose()
        if finish is None:
            # A stream that stops without a finish_reason was cut (proxy, server crash, dropped
            # connection): the answer is incomplete, and asking again may well work.
            raise ModelError(f"{self._name}: stream ended before a finish reason", transient=True)
        # The usage chunk comes after the finish chunk; Finish is always the last event.
        if usage is not None:
            yield usage
        yield Finish(finish)

    def _chunk(self, line: str) -> dict[str, Any] | None:
        """The JSON chunk of one line of the stream (None for lines that carry none)."""
        if not line.startswith("data:"):
            return None  # blank separators, comments (": ping"), event names
        data = line[5:].strip()
        if data == "[DONE]":
            # The caller reads on to the end of the body rather than stop: a response read to
            # its end hands its connection back to the pool; one closed early costs a new TCP
            # connection on the next call.
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            raise ModelError(
                f"{self._name}: the stream sent invalid JSON", transient=True
            ) from None
        error = chunk.get("error")
        if error:
            detail = error.get("message") if isinstance(error, dict) else str(error)
            raise ModelError(f"{self._name}: stream error: {_clip(str(detail))}", transient=True)
        return cast(dict[str, Any], chunk)

    def _error(self, exc: openai.OpenAIError) -> ModelError:
        """A short, retry-classified ModelError for an SDK exception; never a traceback."""
        name = self._name
        if isinstance(exc, openai.APITimeoutError):
            return ModelError(f"{name}: request timed out after {self.timeout:g}s", transient=True)
        if isinstance(exc, openai.APIConnectionError):
            # The SDK's own message is a bare "Connection error."; the transport cause says why.
            cause = exc.__cause__
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
            return ModelError(
                f"{name}: cannot reach {self.base_url}: {_clip(detail)}", transient=True
            )
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            transient = status >= 500 or status in _TRANSIENT_STATUSES
            return ModelError(
                f"{name}: HTTP {status}: {_clip(_server_message(exc))}",
                transient=transient,
                status=status,
            )
        if isinstance(exc, openai.APIError):
            # An error event inside an accepted stream: the server failed mid-answer.
            return ModelError(f"{name}: stream error: {_clip(exc.message)}", transient=True)
        return ModelError(f"{name}: {_clip(str(exc))}")


def _to_openai(message: Message) -> ChatCompletionMessageParam:
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


def _server_message(exc: openai.APIStatusError) -> str:
    # The SDK's message embeds the whole body ("Error code: 500 - {...}"); prefer the server's
    # own error.message, which the SDK unwraps into ``body``.
    body: Any = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body:
        return body
    return exc.response.reason_phrase or exc.message


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 1] + "…"


def _usage(chunk: dict[str, Any]) -> Usage | None:
    raw = chunk.get("usage")
    if not raw:
        return None
    return Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0))


def _deltas(choice: dict[str, Any]) -> Iterator[ModelEvent]:
    """The text and tool-call pieces of one streamed choice."""
    delta = choice.get("delta") or {}
    content = delta.get("content")
    if content:
        yield TextDelta(content)
    for call in delta.get("tool_calls") or ():
        fn = call.get("function") or {}
        yield ToolCallDelta(
            index=int(call.get("index", 0)),
            id=call.get("id") or None,
            name=fn.get("name") or None,
            arguments=fn.get("arguments") or "",
        )
