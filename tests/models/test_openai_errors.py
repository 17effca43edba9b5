"""What the ``openai`` provider's errors say: a sentence of tether's for callers, the upstream's
words (with the key and any URL password masked) in the log only."""

from __future__ import annotations

import pytest

from tether.errors import ModelError
from tether.models.openai import OpenAIModel

KEY = "sk-server-own-key-0123456789"


def test_an_error_event_mid_stream_keeps_its_words_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = OpenAIModel("m", base_url="http://bob:s3cret@10.0.0.7:8080/v1", api_key=KEY)
    line = f'data: {{"error": {{"message": "shard 3 failed; you sent Bearer {KEY}"}}}}'

    # The chunk parser alone: the fake server cannot send an error event inside a stream.
    with pytest.raises(ModelError) as caught:
        model._chunk(line)

    assert str(caught.value) == "openai:m: the model provider failed mid-answer"
    assert caught.value.transient
    assert "shard 3 failed; you sent Bearer ***" in caplog.text
    assert "http://***@10.0.0.7:8080/v1" in caplog.text
    assert KEY not in caplog.text and "s3cret" not in caplog.text


def test_invalid_json_in_the_stream_is_ours_too(caplog: pytest.LogCaptureFixture) -> None:
    model = OpenAIModel("m", base_url="http://127.0.0.1:9/v1", api_key=KEY)
    with pytest.raises(ModelError) as caught:
        model._chunk("data: {not json at /internal/path")
    assert str(caught.value) == "openai:m: the model provider sent invalid JSON"
    assert "/internal/path" in caplog.text
