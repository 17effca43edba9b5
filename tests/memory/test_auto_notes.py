"""Which user messages become automatic notes, and how they read."""

from __future__ import annotations

import pytest

from tether.memory.auto import attribute, statements


@pytest.mark.parametrize(
    ("text", "notes"),
    [
        ("My name is Alice", ["The user's name is Alice."]),
        ("Hi, my name is Alice.", ["The user's name is Alice."]),
        ("I'm 34 years old", ["The user is 34 years old."]),
        ("my favourite colour is green!", ["The user's favourite colour is green."]),
        ("I like pizza. Tell me a joke.", ['The user said: "I like pizza".']),
        ("What's my name?", []),
        ("Please write my essay", []),
        ("Can you remind me of my name", []),
        ("The sky is blue", []),
        ("My password is hunter2", []),
        ("my API key is sk-123 and my name is Ann", []),
        ("", []),
    ],
)
def test_statements(text: str, notes: list[str]) -> None:
    assert statements(text) == notes


def test_notes_are_bounded() -> None:
    many = " ".join(f"My fact number {n} is {n}." for n in range(20))
    assert len(statements(many)) == 5
    assert statements("My " + "very " * 100 + "long sentence.") == []


def test_the_attribute_a_note_states() -> None:
    assert attribute("The user's name is Bob.") == "the user's name is"
    assert attribute("The user's Name is Bob.") == "the user's name is"
    assert attribute('The user said: "I like pizza".') is None
