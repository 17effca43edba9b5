"""How ``tether chat`` asks a decision and reads the answer: it fails closed (I/O-free)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from tether.cli._chat_decisions import as_answer, asking, reading
from tether.cli._chat_view import show_event
from tether.records import Decision, DecisionKind, SessionKey, Verdict
from tether.runtime import verdict_of

TOOL = {"tool": "launch", "arguments": '{"target": "rocket"}'}
LIMIT = {"question": "Continue for up to 5 more?", "steps": 5, "limit": "max_iterations"}
PICK = {"question": "Which planet?", "choices": ["Mars", "Venus"]}
FREE = {"question": "Your name?", "choices": None}


def test_each_kind_is_asked_in_its_own_words() -> None:
    assert asking("approval", TOOL).prompt == 'approve launch({"target": "rocket"})? [y/n/always] '
    assert asking("approval", LIMIT).prompt == "Continue for up to 5 more? [y/N] "
    pick = asking("question", PICK)
    assert pick.lines == ["? Which planet?", "  1. Mars", "  2. Venus"]
    assert pick.prompt == "answer (a number or the text; empty declines): "
    assert asking("question", FREE).prompt == "answer (empty declines): "


@pytest.mark.parametrize(
    ("payload", "line", "verdict"),
    [
        (TOOL, "y", ("approve", None)),
        (TOOL, " YES ", ("approve", None)),
        (TOOL, "always", ("always", None)),
        (TOOL, "n", ("deny", None)),
        (TOOL, "", ("deny", None)),
        (TOOL, "sure", ("deny", None)),  # anything else refuses
        (LIMIT, "y", ("approve", None)),
        (LIMIT, "always", ("deny", None)),  # always is for a tool; going on is once
        (LIMIT, "", ("deny", None)),
    ],
)
def test_an_approval_is_yes_or_always_or_refused(
    payload: dict[str, Any], line: str, verdict: tuple[Verdict, str | None]
) -> None:
    assert reading("approval", payload, line) == verdict


@pytest.mark.parametrize(
    ("payload", "line", "verdict"),
    [
        (PICK, "2", ("answer", "Venus")),
        (PICK, "mars", ("answer", "Mars")),  # the choice as the model wrote it
        (PICK, "3", None),  # not a choice: asked again
        (PICK, "Pluto", None),
        (PICK, "  ", ("deny", None)),  # empty declines
        (FREE, " Ada ", ("answer", "Ada")),
        (FREE, "", ("deny", None)),
    ],
)
def test_a_question_takes_a_choice_or_text(
    payload: dict[str, Any], line: str, verdict: tuple[Verdict, str | None] | None
) -> None:
    assert reading("question", payload, line) == verdict


@pytest.mark.parametrize(
    ("kind", "payload", "verdict"),
    [
        ("approval", TOOL, ("approve", None)),
        ("approval", TOOL, ("always", None)),
        ("approval", TOOL, ("deny", None)),
        ("question", PICK, ("answer", "Mars")),
        ("question", PICK, ("deny", None)),
    ],
)
def test_a_verdict_survives_the_on_decision_convention(
    kind: DecisionKind, payload: dict[str, Any], verdict: tuple[Verdict, str | None]
) -> None:
    """The remote chat answers through the client's on_decision: the same verdict arrives."""
    d = Decision(SessionKey("t", "u", "s"), "t_1", "call_1", kind, payload, "pending", 0.0, 1.0)
    assert verdict_of(d, as_answer(*verdict)) == verdict


def test_a_deadline_that_passed_is_said() -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    show_event(console, "decision.made", {"status": "expired", "decided_by": None})
    show_event(console, "decision.made", {"status": "cancelled", "decided_by": None})
    show_event(console, "decision.made", {"status": "approved", "decided_by": "local"})
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    assert shown.strip() == "nobody decided in time: refused"
