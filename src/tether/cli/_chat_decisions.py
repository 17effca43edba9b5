"""How the chat asks the user what a turn waits for, and reads the answer (I/O-free).

Three kinds of question (DESIGN §7): a tool approval (``y`` / ``n`` / ``always``), the model's
``ask_user`` question (its numbered choices, or free text), and whether to go on past the
iteration limit (``y`` / ``n``). Each fails closed: an approval anything but ``y`` or
``always`` refuses, and an empty answer to a question declines it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tether.records import Verdict
from tether.runtime import DecisionAnswer

YES = ("y", "yes")
ALWAYS = "always"


@dataclass(frozen=True, slots=True)
class Asking:
    """What the chat shows for one decision: lines first, then the prompt it reads after."""

    prompt: str
    lines: list[str] = field(default_factory=list)


def asking(kind: object, payload: dict[str, Any]) -> Asking:
    if kind == "question":
        choices = _choices(payload)
        lines = [f"? {payload.get('question', '')}"]
        lines += [f"  {n}. {choice}" for n, choice in enumerate(choices, 1)]
        if choices:
            return Asking("answer (a number or the text; empty declines): ", lines)
        return Asking("answer (empty declines): ", lines)
    if payload.get("tool"):
        return Asking(f"approve {payload['tool']}({payload.get('arguments', '')})? [y/n/always] ")
    # Going on past the iteration limit: a yes or no, about no tool.
    return Asking(f"{payload.get('question', 'go on?')} [y/N] ")


def reading(kind: object, payload: dict[str, Any], line: str) -> tuple[Verdict, str | None] | None:
    """The verdict ``line`` gives; None when it is not an answer the question takes (one of
    the choices): the chat asks again."""
    text = line.strip()
    if kind == "question":
        if not text:
            return "deny", None
        choices = _choices(payload)
        if not choices:
            return "answer", text
        if text.isdigit() and 1 <= int(text) <= len(choices):
            return "answer", choices[int(text) - 1]
        for choice in choices:
            if choice.casefold() == text.casefold():
                return "answer", choice  # as the model wrote it: the server takes only that
        return None
    word = text.lower()
    if word in YES:
        return "approve", None
    if word == ALWAYS and payload.get("tool"):
        return "always", None
    return "deny", None


def again(payload: dict[str, Any]) -> str:
    """Said when an answer is not one of the choices."""
    return f"pick 1-{len(_choices(payload))} or type one of the choices (empty declines)"


def as_answer(verdict: Verdict, answer: str | None) -> DecisionAnswer:
    """A verdict as an ``on_decision`` callback says it (:func:`tether.runtime.verdict_of`)."""
    if verdict == "answer":
        return answer
    return False if verdict == "deny" else verdict


def _choices(payload: dict[str, Any]) -> list[str]:
    choices = payload.get("choices")
    return [str(c) for c in choices] if isinstance(choices, list) else []
