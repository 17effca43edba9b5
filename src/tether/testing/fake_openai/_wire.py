"""The OpenAI wire format the fake speaks: request checks, errors, answers, SSE, embeddings.

Kept apart from the server so the shapes a client parses (a ``chat.completion``, its
``chat.completion.chunk`` stream, an error body) can be read in one place and compared with
OpenAI's own, without the threads and sockets around them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from tether.testing.fake_openai.replies import FakeCut, FakeLength, FakeReply, FakeToolCall

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
_JSON_SEPARATORS = (",", ":")


def fake_embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``: SHA-256 in counter mode, mapped to [-1, 1)."""
    raw = b"".join(
        hashlib.sha256(f"{i}:{text}".encode()).digest() for i in range(math.ceil(dim * 4 / 32))
    )
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{dim}I", raw[: dim * 4])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def check_messages(messages: Any) -> str | None:
    """The 400 a real server would give for malformed messages, or None."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in {
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        }:
            return f"messages[{i}] has no valid role"
        if m["role"] == "tool" and not m.get("tool_call_id"):
            return f"messages[{i}]: a tool message needs 'tool_call_id'"
        if m["role"] == "assistant" and m.get("content") is None and not m.get("tool_calls"):
            return f"messages[{i}]: an assistant message needs 'content' or 'tool_calls'"
    return None


def error_response(status: int, message: str) -> Response:
    """An OpenAI-shaped error body, its ``type`` chosen by status as OpenAI does."""
    kind = _ERROR_TYPES.get(status, "rate_limit_error" if status == 429 else "server_error")
    error = {"message": message, "type": kind, "param": None, "code": None}
    return JSONResponse({"error": error}, status_code=status)


def _pieces(text: str) -> list[str]:
    """Word-sized pieces (each with its leading whitespace) that join back to ``text``."""
    return re.findall(r"\s*\S+|\s+", text)


@dataclass(slots=True)
class Answer:
    """One chat answer: either text or tool calls, rendered as JSON or as stream chunks."""

    text: str | None
    calls: tuple[FakeToolCall, ...]
    cut: bool
    id: str = ""
    finish: str = "stop"
    """Why a text answer ended: ``stop``, or ``length`` (cut at the output cap)."""
    model: str = ""
    prompt_tokens: int = 0

    @classmethod
    def of(cls, reply: FakeReply, new_call_id: Callable[[], str]) -> Answer:
        if isinstance(reply, FakeToolCall):
            reply = (reply,)
        if isinstance(reply, tuple):
            calls = tuple(FakeToolCall(c.name, c.arguments, c.id or new_call_id()) for c in reply)
            return cls(None, calls, cut=False)
        if isinstance(reply, FakeCut):
            return cls(reply.text, (), cut=True)
        if isinstance(reply, FakeLength):
            return cls(reply.text, (), cut=False, finish="length")
        return cls(str(reply), (), cut=False)

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        }

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text, "refusal": None}
        if self.calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.calls
            ]
            finish, output = "tool_calls", sum(len(_pieces(c.arguments)) + 1 for c in self.calls)
        else:
            finish, output = self.finish, len(_pieces(self.text or ""))
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": self.usage(output),
        }

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of the streamed answer, in OpenAI's order."""
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            c: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
                "system_fingerprint": None,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                c["usage"] = None  # OpenAI sends null usage on every chunk but the last
            return c

        out: list[dict[str, Any]] = []
        output = 0
        if self.calls:
            out.append(chunk({"role": "assistant", "content": None}))
            for index, call in enumerate(self.calls):
                head = {"index": index, "id": call.id, "type": "function"}
                out.append(
                    chunk(
                        {"tool_calls": [{**head, "function": {"name": call.name, "arguments": ""}}]}
                    )
                )
                for piece in _pieces(call.arguments):
                    out.append(
                        chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                    )
                    output += 1
            finish = "tool_calls"
        else:
            out.append(chunk({"role": "assistant", "content": ""}))
            pieces = _pieces(self.text or "")
            out.extend(chunk({"content": piece}) for piece in pieces)
            output = len(pieces)
            finish = self.finish
        if self.cut:
            return out
        out.append(chunk({}, finish))
        if include_usage:
            last = chunk({})
            last["choices"] = []
            last["usage"] = self.usage(output)
            out.append(last)
        return out


async def sse(
    events: list[dict[str, Any]], *, done: bool, delay: float = 0.0
) -> AsyncIterator[bytes]:
    """Server-sent events as OpenAI frames them, ``delay`` seconds apart; ``done`` ends with
    ``data: [DONE]``."""
    for i, event in enumerate(events):
        if delay > 0 and i:
            await asyncio.sleep(delay)
        yield b"data: " + json.dumps(event, separators=_JSON_SEPARATORS).encode() + b"\n\n"
    if done:
        yield b"data: [DONE]\n\n"
