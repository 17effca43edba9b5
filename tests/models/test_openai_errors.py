"""What the ``openai`` provider's errors say: a sentence of tether's for callers, the upstream's
words (with the key and any URL password masked) in the log only."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator

import httpx2
import pytest

from tether.errors import ModelError
from tether.models import TextDelta, ToolCallDelta
from tether.models.openai import OpenAIModel
from tether.models.openai_stream import Answer, body_of, reads

KEY = "sk-server-own-key-0123456789"


def _read(model: OpenAIModel, *lines: bytes) -> tuple[list[object], ModelError | None]:
    """What the chunk reader makes of ``lines`` (one read of the connection), then of the end
    of the body."""
    answer = Answer(model._failed)
    events, error = answer.read(list(lines))
    return list(events), error or answer.end()


def test_an_error_event_mid_stream_keeps_its_words_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = OpenAIModel("m", base_url="http://bob:s3cret@10.0.0.7:8080/v1", api_key=KEY)
    line = f'data: {{"error": {{"message": "shard 3 failed; you sent Bearer {KEY}"}}}}'

    # The chunk reader alone: the fake server cannot send an error event inside a stream.
    events, error = _read(model, line.encode(), b"")

    assert events == [] and error is not None
    assert str(error) == "openai:m: the model provider failed mid-answer"
    assert error.transient
    assert "shard 3 failed; you sent Bearer ***" in caplog.text
    assert "http://***@10.0.0.7:8080/v1" in caplog.text
    assert KEY not in caplog.text and "s3cret" not in caplog.text


def test_invalid_json_in_the_stream_is_ours_too(caplog: pytest.LogCaptureFixture) -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    for lines in ([b"data: {not json at /internal/path", b""], [b"data: {not json at /x/y"]):
        # Said at the blank line that ends the event, or at the end of the body.
        events, error = _read(model, *lines)
        assert events == [] and error is not None
        assert str(error) == "openai:m: the model provider sent invalid JSON"
        assert error.transient
    assert "/internal/path" in caplog.text and "/x/y" in caplog.text


def _text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_chunks_the_standard_library_reads_are_still_read() -> None:
    """Chunks are read with orjson, but a provider's chunk that only Python's json accepts
    (NaN, an escaped lone surrogate) is read as before rather than failing the turn."""
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    plain = rb'data: {"choices": [{"index": 0, "delta": {"content": "x\u00e9"}}]}'
    odd = rb'data: {"usage": {"cost": NaN}, "choices": [{"delta": {"content": "\ud83d"}}]}'
    events, error = _read(model, plain, b"", odd, b"")
    assert error is None and _text(events) == "x\u00e9\ud83d"


@pytest.mark.parametrize(
    "data",
    [
        b"null",
        b"42",
        b"[]",
        b'{"choices": [null]}',
        b'{"choices": [{"index": 0, "delta": {"content": 5}}]}',
        b'{"choices": [{"index": 0, "delta": "text"}]}',
        b'{"usage": {"prompt_tokens": "n/a"}}',
        b'{"choices": 7}',
        b'{"choices": [{"index": 0, "delta": {"tool_calls": ["add"]}}]}',
    ],
)
def test_a_chunk_of_the_wrong_shape_is_the_providers_failure_after_the_text_so_far(
    data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Valid JSON that is no chat completion chunk is said as a ModelError (the turn keeps the
    text that came before it, flagged incomplete), never an AttributeError or TypeError that
    ends the turn as tether's own internal error."""
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    events, error = _read(model, _line({"content": "hel"}), b"", b"data: " + data, b"")
    assert _text(events) == "hel"
    assert isinstance(error, ModelError) and error.transient
    assert str(error).startswith("openai:m: the model provider sent a chunk")
    assert data.decode() in caplog.text or "n/a" in caplog.text


def test_a_tool_call_whose_index_is_null_is_the_first_call() -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    call = {"index": None, "id": "c1", "function": {"name": "add", "arguments": "{}"}}
    events, error = _read(model, _line({"tool_calls": [call]}, finish="tool_calls"), b"")
    assert error is None
    assert events == [ToolCallDelta(index=0, id="c1", name="add", arguments="{}")]


def test_an_event_whose_data_runs_over_several_lines_is_one_chunk() -> None:
    """SSE: the data lines of one event are joined with newlines (the SDK reads them so)."""
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    first = b'data: {"choices":[{"index":0,'
    second = b'data: "delta":{"content":"lo"},"finish_reason":null}]}'
    events, error = _read(model, _line({"content": "hel"}), b"", first, second, b"")
    assert error is None and _text(events) == "hello"
    # Cut between two reads of the connection, too.
    model_answer = Answer(model._failed)
    got, error = model_answer.read([_line({"content": "hel"}), b"", first])
    more, error2 = model_answer.read([second, b"", b"data: [DONE]", b""])
    assert error is None and error2 is None and model_answer.end() is None
    assert _text([*got, *more]) == "hello"


async def _cut(*pieces: bytes) -> AsyncIterator[bytes]:
    """A streamed body cut into the pieces given, as a transport may hand them over."""
    for piece in pieces:
        yield piece


async def test_stream_lines_survive_any_cut_between_chunks() -> None:
    whole = b'data: {"a": 1}\r\n\r\ndata: {"b": "x\\u00e9"}\n\n: ping\r\ndata: [DONE]'
    expected = [b'data: {"a": 1}', b'data: {"b": "x\\u00e9"}', b": ping", b"data: [DONE]"]
    for cut in range(1, len(whole)):
        body = _cut(whole[:cut], b"", whole[cut:])
        lines = [line async for lines in reads(body) for line in lines]
        # Blank lines are SSE's separators (a cut "\r\n" makes one more): only the rest counts.
        assert [line for line in lines if line] == expected, cut
    one_by_one = _cut(*(whole[i : i + 1] for i in range(len(whole))))
    assert [line async for lines in reads(one_by_one) for line in lines if line] == expected


class _Stream(httpx2.AsyncByteStream):
    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


async def test_a_plain_body_is_read_from_the_transport_and_an_encoded_one_decoded() -> None:
    """The answer's bytes come straight from the transport's stream when the body is plain (as
    SSE is), and through httpx2's decoder when the server encoded it."""
    sse = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    plain = httpx2.Response(200, stream=_Stream(sse[:7], sse[7:]))
    assert body_of(plain) is plain.stream
    assert [line async for got in reads(body_of(plain)) for line in got if line] == [
        b'data: {"a": 1}',
        b"data: [DONE]",
    ]
    packed = gzip.compress(sse)
    encoded = httpx2.Response(
        200, headers={"content-encoding": "gzip"}, stream=_Stream(packed[:10], packed[10:])
    )
    assert [line async for got in reads(body_of(encoded)) for line in got if line] == [
        b'data: {"a": 1}',
        b"data: [DONE]",
    ]


def _line(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode()


def test_what_one_read_brought_is_one_text_delta_around_tool_calls_and_before_an_error() -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    answer = Answer(model._failed)
    call = {"index": 0, "id": "c1", "function": {"name": "add", "arguments": "{}"}}
    events, error = answer.read(
        [
            _line({"content": "It"}),
            b"",
            _line({"content": " is"}),
            _line({"tool_calls": [call]}),
            _line({"content": " 42."}, finish="stop"),
        ],
    )
    assert error is None and answer.finish == "stop"
    assert events == [
        TextDelta("It is"),
        ToolCallDelta(index=0, id="c1", name="add", arguments="{}"),
        TextDelta(" 42."),
    ]
    events, error = answer.read([_line({"content": "half"}), b"data: {not json", b""])
    assert events == [TextDelta("half")]  # what came before the bad line is the answer's
    assert isinstance(error, ModelError)
