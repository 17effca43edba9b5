"""Messages on OpenAI's wire (models/openai_messages.py): a conversation's prompt is encoded once
as it grows, and what is sent is always what encoding every message afresh sends."""

from __future__ import annotations

import random

import orjson
import pytest

from tether.errors import ModelError
from tether.models import Message, ToolCall, openai_messages
from tether.models.openai_messages import Encoded, to_openai


def _sent(enc: Encoded, prompt: list[Message]) -> object:
    return orjson.loads(orjson.dumps({"messages": enc.array(prompt)}))["messages"]


def _afresh(prompt: list[Message]) -> list[object]:
    return [to_openai(m) for m in prompt]


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[Message]:
    """The messages encoded from now on, in order."""
    encoded: list[Message] = []
    real = openai_messages.encode

    def counting(message: Message) -> bytes:
        encoded.append(message)
        return real(message)

    monkeypatch.setattr(openai_messages, "encode", counting)
    return encoded


def _same(encoded: list[Message], expected: list[Message]) -> bool:
    """The same message objects, in any order."""
    return sorted(map(id, encoded)) == sorted(map(id, expected))


def test_a_prompt_is_its_messages_as_json() -> None:
    prompts = [
        [],
        [Message("user", "alone")],
        [Message("system", "only instructions")],
        [Message("system", "be brief"), Message("user", "hi")],
        [
            Message("system", "be brief"),
            Message("user", 'say "hi" \u2603 \x01'),
            Message("assistant", "", (ToolCall("c1", "find", '{"q": 1}'),)),
            Message("tool", "found", tool_call_id="c1"),
            Message("assistant", "done"),
            Message("user", "and?"),
        ],
    ]
    enc = Encoded()
    for prompt in prompts:
        assert _sent(enc, prompt) == _afresh(prompt)
    assert to_openai(prompts[-1][2])["content"] is None  # null, not "", beside tool calls


def test_the_next_turn_encodes_only_what_is_new(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded = _counted(monkeypatch)
    enc = Encoded()
    history = [Message("user" if n % 2 == 0 else "assistant", f"m{n}") for n in range(600)]
    first = [Message("system", "be brief"), *history, Message("user", "next")]
    assert _sent(enc, first) == _afresh(first)
    assert len(encoded) == 602
    encoded.clear()
    # The next turn: the same history objects, the turn before's two items (rendered anew from
    # history), a new system message and a new input.
    added = [Message("user", "next"), Message("assistant", "ok")]
    second = [Message("system", "be brief"), *history, *added, Message("user", "then")]
    assert _sent(enc, second) == _afresh(second)
    assert _same(encoded, [second[0], *added, second[-1]])
    # The window full: its oldest ten go, two more come.
    encoded.clear()
    more = [Message("user", "then"), Message("assistant", "fine")]
    third = [Message("system", "be brief"), *history[10:], *added, *more, Message("user", "x")]
    assert _sent(enc, third) == _afresh(third)
    assert _same(encoded, [third[0], *more, third[-1]])
    assert len(enc) == 1


def test_leading_system_messages_made_anew_each_turn_are_no_part_of_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The instructions and the summary of what fell out of the window come first and are made
    anew every turn: the run after them is still found."""
    encoded = _counted(monkeypatch)
    enc = Encoded()
    history = [Message("user" if n % 2 == 0 else "assistant", f"m{n}") for n in range(100)]
    for turn in range(3):
        encoded.clear()
        lead = [Message("system", "be brief"), Message("system", "Summary: earlier things")]
        prompt = [*lead, *history, Message("user", f"question {turn}")]
        assert _sent(enc, prompt) == _afresh(prompt)
        if turn:
            assert _same(encoded, [*lead, history[-2], history[-1], prompt[-1]])
        history += [Message("user", f"question {turn}"), Message("assistant", f"answer {turn}")]


def test_what_the_runs_are_counted_to_hold_is_what_they_hold() -> None:
    """Two prompts whose runs end with the same message: the second replaces the first, and
    the count of what is held goes down by what the first held."""
    enc = Encoded()
    shared = Message("assistant", "same ending")
    enc.array([Message("user", "one"), shared, Message("user", "q")])
    enc.array([Message("user", "another, longer beginning"), shared, Message("user", "q")])
    assert len(enc) == 1
    held = sum(openai_messages._held(run) for run in enc._young.values())
    assert enc._bytes == held


def test_a_run_is_used_only_for_its_very_messages() -> None:
    """Equal messages that are other objects, or the same objects in another order, are
    encoded as they are: nothing is taken for another object's JSON."""
    enc = Encoded()
    history = [Message("user", f"m{n}") for n in range(5)]
    enc.array([*history, Message("user", "next")])
    twins = [Message("user", f"m{n}") for n in range(5)]
    assert _sent(enc, [*twins, Message("user", "x")]) == _afresh([*twins, Message("user", "x")])
    shuffled = [history[1], history[0], *history[2:], Message("user", "y")]
    assert _sent(enc, shuffled) == _afresh(shuffled)
    edited = [*history[:3], Message("user", "changed"), history[4], Message("user", "z")]
    assert _sent(enc, edited) == _afresh(edited)


@pytest.mark.parametrize("seed", range(30))
def test_conversations_that_grow_slide_retry_and_interleave_are_sent_as_they_are(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several conversations through one model, turn after turn in random order: windows that
    grow, lose their oldest messages, take tool steps, are retried as they were, or are
    rendered afresh (another lease); a budget small enough that runs are dropped. Every prompt
    is sent as encoding each of its messages afresh would send it."""
    monkeypatch.setattr(openai_messages, "MAX_BYTES", 6_000 + seed * 500)
    rng = random.Random(seed)
    enc = Encoded()
    windows: list[list[Message]] = [[] for _ in range(4)]
    last: list[list[Message]] = [[] for _ in range(4)]
    for step in range(300):
        c = rng.randrange(4)
        window = windows[c]
        action = rng.random()
        if action < 0.1 and last[c]:
            prompt = last[c]  # a retry of the same request
        else:
            if action < 0.2:
                window[:] = [
                    Message(m.role, m.content, m.tool_calls, m.tool_call_id) for m in window
                ]
            elif action < 0.35 and window:
                del window[: rng.randint(1, min(6, len(window)))]
            for n in range(rng.choice((1, 2, 2, 4))):
                if rng.random() < 0.2:
                    call = ToolCall(f"c{step}-{n}", "f", "{}")
                    window += [
                        Message("assistant", "", (call,)),
                        Message("tool", "r", tool_call_id=call.id),
                    ]
                else:
                    window.append(Message(rng.choice(("user", "assistant")), f"{c}:{step}:{n}"))
            system = [Message("system", "sys")] if rng.random() < 0.8 else []
            prompt = [*system, *window, Message("user", f"input {step}")]
        last[c] = prompt
        assert _sent(enc, prompt) == _afresh(prompt)


def test_what_is_remembered_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(openai_messages, "MAX_BYTES", 20_000)
    enc = Encoded()
    for c in range(200):
        history = [Message("user", f"{c}-{n} " + "x" * 100) for n in range(5)]
        enc.array([*history, Message("user", "q")])
    assert len(enc) <= 20_000 // 500


def test_a_tool_message_without_its_call_is_refused() -> None:
    with pytest.raises(ModelError, match="tool_call_id"):
        Encoded().array([Message("tool", "orphan"), Message("user", "q")])
