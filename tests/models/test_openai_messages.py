"""Messages on OpenAI's wire (models/openai_messages.py): each message object is encoded once
while it is in use, and what is sent is what encoding it afresh sends."""

from __future__ import annotations

import orjson
import pytest

from tether.errors import ModelError
from tether.models import Message, ToolCall, openai_messages
from tether.models.openai_messages import Encoded, to_openai


def _body(fragments: list[orjson.Fragment]) -> list[object]:
    loaded = orjson.loads(orjson.dumps(fragments))
    assert isinstance(loaded, list)
    return loaded


def _prompt() -> list[Message]:
    return [
        Message("system", "be brief"),
        Message("user", 'say "hi" \u2603 \x01'),
        Message("assistant", "", (ToolCall("c1", "find", '{"q": 1}'),)),
        Message("tool", "found", tool_call_id="c1"),
        Message("assistant", "done"),
    ]


def test_the_fragments_are_the_messages_as_json() -> None:
    prompt = _prompt()
    assert _body(Encoded()(prompt)) == [to_openai(m) for m in prompt]
    assert to_openai(prompt[2])["content"] is None  # null, not "", beside tool calls


def test_a_message_object_is_encoded_once_while_it_is_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded: list[Message] = []
    real = openai_messages.to_openai

    def counting(message: Message) -> object:
        encoded.append(message)
        return real(message)

    monkeypatch.setattr(openai_messages, "to_openai", counting)
    enc = Encoded()
    prompt = _prompt()
    enc(prompt)
    assert encoded == prompt
    encoded.clear()
    # The next turn: the same objects, a new system message, one more message at the end.
    following = [Message("system", "be brief"), *prompt[1:], Message("user", "and?")]
    assert _body(enc(following)) == [to_openai(m) for m in following]
    assert encoded == [following[0], following[-1]]
    # An equal message that is another object is encoded on its own (nothing is taken for
    # another object's), and system messages are never kept.
    encoded.clear()
    twin = Message("user", 'say "hi" \u2603 \x01')
    enc([twin])
    assert encoded == [twin]
    assert len(enc) == 6


def test_what_is_remembered_is_bounded_and_what_is_sent_again_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two generations of at most half the bytes each: a conversation's messages, sent turn
    after turn, stay remembered (encoded once) however many others come and go; a message sent
    once is forgotten; one too large is never kept."""
    monkeypatch.setattr(openai_messages, "MAX_BYTES", 4_000)
    monkeypatch.setattr(openai_messages, "LARGEST", 500)
    encoded: list[Message] = []
    real = openai_messages.to_openai

    def counting(message: Message) -> object:
        encoded.append(message)
        return real(message)

    monkeypatch.setattr(openai_messages, "to_openai", counting)
    enc = Encoded()
    kept = [Message("user", f"kept {n}") for n in range(5)]
    once = [Message("user", f"{n} " + "x" * 100) for n in range(200)]
    for n in range(0, 200, 4):
        prompt = [*kept, *once[n : n + 4]]
        assert _body(enc(prompt)) == [to_openai(m) for m in prompt]
        assert len(enc) <= 4_000 // 100
    assert encoded.count(kept[0]) == 1
    assert all(m in enc for m in kept)
    assert once[0] not in enc and once[-1] in enc
    big = Message("user", "y" * 1_000)
    assert _body(enc([big])) == [to_openai(big)]
    assert big not in enc


def test_a_tool_message_without_its_call_is_refused() -> None:
    with pytest.raises(ModelError, match="tool_call_id"):
        Encoded()([Message("tool", "orphan")])
