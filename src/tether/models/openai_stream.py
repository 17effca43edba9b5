"""Reading a streamed chat completion: its bytes, its server-sent events, its chunks.

What a provider streams is read here as plain bytes and JSON rather than through the SDK's
event decoder and per-chunk model objects, which cost several ms of CPU a turn. What arrives
is trusted no further than its shape: a chunk that is not the object a chat completion chunk
is (an array, a number, a choice that is null, a count that is not one) is the provider's
failure, said as a ModelError like invalid JSON is, never an exception of Python's from deep in
the turn loop.

Events follow the SSE rules where providers rely on them: a ``data:`` field may continue over
several lines of one event (joined by newlines), comments and other fields are skipped, and a
blank line ends the event. Providers also rely on a leniency of the old per-line reading: most
write one JSON object a ``data:`` line and some leave out the blank lines, so a line whose data
is a whole JSON value is taken at once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from typing import Any, Final

import httpx2
import orjson

from tether.errors import ModelError
from tether.models.base import FinishReason, ModelEvent, TextDelta, ToolCallDelta, Usage

__all__ = ["Answer", "body_of", "reads"]

FINISH_REASONS: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}
_NOTHING: Final = object()
"""What a line that completes no event's data gives (JSON's null is a value, a wrong one)."""
Fail = Callable[[str, str], ModelError]
"""Makes the ModelError of what went wrong (ours, for callers) and the detail (the log's)."""


class Answer:
    """One streamed answer as its events are read."""

    __slots__ = ("_fail", "_pending", "finish", "usage")

    def __init__(self, fail: Fail) -> None:
        self._fail = fail
        self._pending: list[bytes] = []
        """The data lines of an event not ended yet, that are no JSON value on their own."""
        self.usage: Usage | None = None
        self.finish: FinishReason | None = None

    def read(self, lines: list[bytes]) -> tuple[list[ModelEvent], ModelError | None]:
        """The events of one read's lines, and the error of a line that fails (after the
        events of the lines before it: what came before is still the answer's).

        The text of the chunks that came in one read of the connection is one delta: a model
        streaming word by word over time still gives a delta a word, while words that came
        together (a busy server reads late, a fast model writes at once) are passed on at once,
        for a fraction of what each delta costs down the line (the turn loop, the event, every
        follower)."""
        out: list[ModelEvent] = []
        text: list[str] = []
        try:
            for line in lines:
                if not line and not self._pending:
                    continue  # the blank line after each event: nothing to read (most lines)
                chunk = self._event(line)
                if chunk is not _NOTHING:
                    self._take(chunk, out, text)
        except ModelError as exc:
            return _with_text(out, text), exc
        return _with_text(out, text), None

    def end(self) -> ModelError | None:
        """At the end of the body: the error of an event left unfinished, if one was."""
        if not self._pending:
            return None
        data, self._pending = b"\n".join(self._pending), []
        return self._fail("the model provider sent invalid JSON", _shown(data))

    def _event(self, line: bytes) -> Any:
        """The JSON value an event's data gave, once the line completes one; else _NOTHING."""
        if line.startswith(b"data:"):
            data = line[5:]
            if self._pending:
                self._pending.append(data[1:] if data[:1] == b" " else data)
                try:
                    value = _loads(b"\n".join(self._pending))
                except ValueError:
                    return _NOTHING  # more lines to come, or a blank line to say it is invalid
                self._pending.clear()
                return value
            data = data.strip()
            if data == b"[DONE]":
                # The caller reads on to the end of the body rather than stop: a response read
                # to its end hands its connection back to the pool; one closed early costs a
                # new TCP connection on the next call.
                return _NOTHING
            try:  # _loads, inline: this is every chunk's path
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                try:
                    return json.loads(data)
                except ValueError:
                    self._pending.append(data)  # perhaps the first line of several
                    return _NOTHING
        if not line and self._pending:  # the blank line that ends an event
            data, self._pending = b"\n".join(self._pending), []
            raise self._fail("the model provider sent invalid JSON", _shown(data))
        return _NOTHING  # blank separators, comments (": ping"), event names, ids

    def _take(self, chunk: Any, out: list[ModelEvent], text: list[str]) -> None:
        """What one chunk says: text into ``text``, tool-call pieces into ``out`` (after the
        text before them), usage and the finish reason kept."""
        if not isinstance(chunk, dict):
            raise self._fail("the model provider sent a chunk that is not an object", _shown(chunk))
        error = chunk.get("error")
        if error:
            detail = error.get("message") if isinstance(error, dict) else error
            raise self._fail("the model provider failed mid-answer", str(detail))
        try:
            # Some servers repeat running totals: the last wins.
            usage = chunk.get("usage")
            if usage:
                self.usage = _usage(usage)
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) != 0:
                    continue  # only one choice (n=1) is ever requested
                delta = choice.get("delta")
                if delta:
                    # Text first, inline: it is what nearly every chunk carries.
                    content = delta.get("content")
                    if content:
                        if not isinstance(content, str):
                            raise TypeError(f"content is a {type(content).__name__}")
                        text.append(content)
                    calls = delta.get("tool_calls")
                    if calls:
                        if text:
                            out.append(TextDelta("".join(text)))
                            text.clear()
                        out.extend(_call_deltas(calls))
                reason = choice.get("finish_reason")
                if reason is not None:
                    self.finish = FINISH_REASONS.get(reason, "other")
        except (AttributeError, TypeError, ValueError) as exc:
            raise self._fail(
                "the model provider sent a chunk tether cannot read", f"{exc}: {_shown(chunk)}"
            ) from None


def _with_text(out: list[ModelEvent], text: list[str]) -> list[ModelEvent]:
    if text:
        out.append(TextDelta("".join(text)))
    return out


def _shown(value: Any) -> str:
    """A chunk or a line's data as the log shows it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


async def reads(body: AsyncIterable[bytes]) -> AsyncIterator[list[bytes]]:
    """The complete lines of a streamed body, without their ends, read by read (a line cut
    between two reads comes with the second).

    httpx2's ``aiter_lines`` decodes every chunk to text and splits it in three layers of
    generators; an answer arrives as dozens of small chunks, and only ``data:`` lines matter
    here, which json reads as bytes. A ``\\r\\n`` cut between two chunks yields one extra
    empty line, which SSE ignores like any blank line.
    """
    rest = b""
    async for chunk in body:
        lines = (rest + chunk).splitlines(keepends=True) if rest else chunk.splitlines(True)
        rest = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        if lines:
            yield [line.rstrip(b"\r\n") for line in lines]
    if rest:
        yield [rest]


def body_of(response: httpx2.Response) -> AsyncIterable[bytes]:
    """The body's bytes as they arrive: straight from the transport's stream when the body is
    not encoded (SSE never is, in practice), through httpx2's decoder otherwise. Each chunk
    of a streamed answer went through four generators (the decoder, two chunkers, the raw
    reader) that did nothing to it."""
    encoding = response.headers.get("content-encoding")
    stream = response.stream
    if isinstance(stream, httpx2.AsyncByteStream) and (
        encoding is None or encoding.strip().lower() in ("", "identity")
    ):
        response.is_stream_consumed = True  # read here: the SDK must not read it again
        return stream
    return response.aiter_bytes()


def _loads(data: bytes) -> Any:
    """A chunk's JSON: orjson's, or, where orjson refuses what the standard library reads (NaN,
    an escaped lone surrogate), the standard library's, so a provider's odd chunk is read as it
    was before orjson. Raises ValueError for what neither reads."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


def _usage(raw: dict[str, Any]) -> Usage:
    return Usage(int(raw.get("prompt_tokens") or 0), int(raw.get("completion_tokens") or 0))


def _call_deltas(calls: list[dict[str, Any]]) -> Iterator[ToolCallDelta]:
    """The tool-call pieces of one streamed choice's delta."""
    for call in calls:
        fn = call.get("function") or {}
        yield ToolCallDelta(
            # An index the server leaves null is the first call's, as the SDK reads it.
            index=int(call.get("index") or 0),
            id=call.get("id") or None,
            name=fn.get("name") or None,
            arguments=fn.get("arguments") or "",
        )
