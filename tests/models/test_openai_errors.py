"""What the ``openai`` provider's errors say: a sentence of tether's for callers, the upstream's
words (with the key and any URL password masked) in the log only."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import AsyncIterator

import httpx2
import pytest

from tether.errors import ModelError
from tether.models import TextDelta, ToolCallDelta
from tether.models.openai import OpenAIModel, _Answer, _body, _reads

KEY = "sk-server-own-key-0123456789"


def test_an_error_event_mid_stream_keeps_its_words_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = OpenAIModel("m", base_url="http://bob:s3cret@10.0.0.7:8080/v1", api_key=KEY)
    line = f'data: {{"error": {{"message": "shard 3 failed; you sent Bearer {KEY}"}}}}'

    # The chunk parser alone: the fake server cannot send an error event inside a stream.
    with pytest.raises(ModelError) as caught:
        model._chunk(line.encode())

    assert str(caught.value) == "openai:m: the model provider failed mid-answer"
    assert caught.value.transient
    assert "shard 3 failed; you sent Bearer ***" in caplog.text
    assert "http://***@10.0.0.7:8080/v1" in caplog.text
    assert KEY not in caplog.text and "s3cret" not in caplog.text


def test_invalid_json_in_the_stream_is_ours_too(caplog: pytest.LogCaptureFixture) -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    with pytest.raises(ModelError) as caught:
        model._chunk(b"data: {not json at /internal/path")
    assert str(caught.value) == "openai:m: the model provider sent invalid JSON"
    assert "/internal/path" in caplog.text


def test_chunks_the_standard_library_reads_are_still_read() -> None:
    """Chunks are read with orjson, but a provider's chunk that only Python's json accepts
    (NaN, an escaped lone surrogate) is read as before rather than failing the turn."""
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    plain = model._chunk(rb'data: {"choices": [{"index": 0, "delta": {"content": "x\u00e9"}}]}')
    assert plain == {"choices": [{"index": 0, "delta": {"content": "x\u00e9"}}]}
    odd = model._chunk(rb'data: {"usage": {"cost": NaN}, "text": "\ud83d"}')
    assert odd is not None and odd["text"] == "\ud83d" and math.isnan(odd["usage"]["cost"])


async def _cut(*pieces: bytes) -> AsyncIterator[bytes]:
    """A streamed body cut into the pieces given, as a transport may hand them over."""
    for piece in pieces:
        yield piece


async def test_stream_lines_survive_any_cut_between_chunks() -> None:
    whole = b'data: {"a": 1}\r\n\r\ndata: {"b": "x\\u00e9"}\n\n: ping\r\ndata: [DONE]'
    expected = [b'data: {"a": 1}', b'data: {"b": "x\\u00e9"}', b": ping", b"data: [DONE]"]
    for cut in range(1, len(whole)):
        body = _cut(whole[:cut], b"", whole[cut:])
        lines = [line async for lines in _reads(body) for line in lines]
        # Blank lines are SSE's separators (a cut "\r\n" makes one more): only the rest counts.
        assert [line for line in lines if line] == expected, cut
    one_by_one = _cut(*(whole[i : i + 1] for i in range(len(whole))))
    assert [line async for lines in _reads(one_by_one) for line in lines if line] == expected


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
    assert _body(plain) is plain.stream
    assert [line async for got in _reads(_body(plain)) for line in got if line] == [
        b'data: {"a": 1}',
        b"data: [DONE]",
    ]
    packed = gzip.compress(sse)
    encoded = httpx2.Response(
        200, headers={"content-encoding": "gzip"}, stream=_Stream(packed[:10], packed[10:])
    )
    assert [line async for got in _reads(_body(encoded)) for line in got if line] == [
        b'data: {"a": 1}',
        b"data: [DONE]",
    ]


def _line(delta: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode()


def test_what_one_read_brought_is_one_text_delta_around_tool_calls_and_before_an_error() -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    answer = _Answer()
    call = {"index": 0, "id": "c1", "function": {"name": "add", "arguments": "{}"}}
    events, error = answer.read(
        model,
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
    events, error = answer.read(model, [_line({"content": "half"}), b"data: {not json"])
    assert events == [TextDelta("half")]  # what came before the bad line is the answer's
    assert isinstance(error, ModelError)
