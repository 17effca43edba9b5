"""The store's shared rules on their own (every backend calls these; the conformance suite
checks the backends carry them out)."""

from __future__ import annotations

import pytest

from tether.errors import QueueFull, SessionBusy, SessionNotFound
from tether.records import ABORTED_TOOL_RESULT, Item
from tether.store import rules
from tether.store.rows import cancel_of


def test_admission() -> None:
    idle: list[tuple[str, str]] = []
    busy = [("t1", "running"), ("t2", "queued")]
    rules.admit("reject", expires_at=None, now=10.0, active=idle, max_queue=16)
    rules.admit("enqueue", expires_at=11.0, now=10.0, active=busy, max_queue=2)
    with pytest.raises(SessionNotFound):
        rules.admit("enqueue", expires_at=10.0, now=10.0, active=idle, max_queue=16)
    with pytest.raises(SessionBusy) as refused:
        rules.admit("reject", expires_at=None, now=10.0, active=busy, max_queue=16)
    assert refused.value.busy_turn_id == "t1" and not isinstance(refused.value, QueueFull)
    with pytest.raises(QueueFull) as full:
        rules.admit("interrupt", expires_at=None, now=10.0, active=busy, max_queue=1)
    assert full.value.busy_turn_id == "t2"  # the oldest queued turn
    # A bound of 0 refuses on an idle session too, naming no turn (it raised IndexError).
    with pytest.raises(QueueFull) as none:
        rules.admit("enqueue", expires_at=None, now=10.0, active=idle, max_queue=0)
    assert none.value.busy_turn_id is None


def test_what_each_ending_does_to_its_items() -> None:
    assert rules.items_effect("rolled_back") == "delete"
    assert rules.items_effect("failed") == "exclude"
    for status in ("completed", "cancelled", "interrupted", "limit_reached"):
        assert rules.items_effect(status) == "keep"


def test_unanswered_calls_get_an_aborted_result() -> None:
    def item(seq: int, kind: str, call_id: str | None) -> Item:
        return Item(seq, "t1", kind, "", True, call_id, "f", None, {}, 0.0)  # type: ignore[arg-type]

    items = [item(1, "tool_call", "a"), item(2, "tool_result", "a"), item(3, "tool_call", "b")]
    calls = rules.unanswered_calls(items)
    assert calls == [("b", "f")]
    [aborted] = rules.aborted_results(calls)
    assert (aborted.kind, aborted.call_id, aborted.content) == (
        "tool_result",
        "b",
        ABORTED_TOOL_RESULT,
    )


@pytest.mark.parametrize(
    ("raw", "read"),
    [
        ('{"status": "interrupted", "reason": "interrupt"}', ("interrupted", "interrupt")),
        (
            '{"status": "rolled_back", "reason": "rollback by turn t_1"}',
            ("rolled_back", "rollback"),
        ),
        (
            '{"status": "interrupted", "reason": "interrupt by turn t_1"}',
            ("interrupted", "interrupt"),
        ),
        ('{"status": "paused", "reason": "cancelled"}', ("cancelled", "cancelled")),
        ("not json", ("cancelled", "cancelled")),
        ("[1, 2]", ("cancelled", "cancelled")),
    ],
)
def test_a_stored_cancel_request_always_reads_as_one_that_ends_the_turn(
    raw: str, read: tuple[str, str]
) -> None:
    assert cancel_of(raw) == read
