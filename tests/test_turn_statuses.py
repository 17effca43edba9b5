"""The statuses a turn can have are exactly the ones something produces (DESIGN §3).

A declared status nothing produces is a trap: clients write code for it and stores and schemas
carry it. ``rejected`` was one: a submission refused by the ``reject`` policy or a full queue
is answered 409/429 and stores nothing (no turn, no seq), so no turn ever has that status.
"""

from __future__ import annotations

from typing import get_args

from tether.records import ACTIVE_STATUSES, TERMINAL_STATUSES, CancelStatus, EndStatus, TurnStatus

# What ends a turn: the loop answers (completed) or hits a limit (limit_reached); everything
# else is a cancellation of some kind (closed() with a CancelStatus), including failed
# (model error, internal error, lease lost; recovery and a missing agent write it directly).
PRODUCED_ENDINGS = {"completed", "limit_reached", *get_args(CancelStatus)}


def test_every_ending_is_one_that_something_produces() -> None:
    assert set(get_args(EndStatus)) == PRODUCED_ENDINGS
    assert TERMINAL_STATUSES == PRODUCED_ENDINGS


def test_a_turn_is_active_or_ended_and_nothing_else() -> None:
    assert set(get_args(TurnStatus)) == ACTIVE_STATUSES | TERMINAL_STATUSES
    assert not ACTIVE_STATUSES & TERMINAL_STATUSES
