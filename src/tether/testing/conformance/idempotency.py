"""Idempotent submission (DESIGN §4): a key names one turn of a session, for a day.

The same key and the same request again returns the turn it made (queued, running or ended),
before any admission check; the key with a different request is IdempotencyKeyReused and
changes nothing; the key on another session, or another owner's session with the same id, is
another key; a key older than the window names a new turn.
"""

from __future__ import annotations

import asyncio

import pytest

from tether.errors import IdempotencyKeyReused, SessionBusy
from tether.records import Idempotency, SessionKey, Turn
from tether.store import rules
from tether.store.protocol import Store
from tether.testing.conformance._support import key, new_session, snapshot

ASKED = Idempotency("retry-1", "digest-of-hello")


async def _submit(store: Store, k: SessionKey, turn_id: str) -> Turn:
    return await store.enqueue_turn(
        k, turn_id=turn_id, input="hello", policy="enqueue", idempotency=ASKED
    )


class IdempotencyConformance:
    """One key, one turn, however often and however concurrently it is sent.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_a_retry_gets_the_turn_its_key_made(self, store: Store) -> None:
        k = await new_session(store)
        first = await _submit(store, k, "t1")
        again = await store.enqueue_turn(
            k, turn_id="t2", input="hello", policy="reject", idempotency=ASKED
        )
        # Even under policy=reject while t1 is queued: the retry is answered, not admitted.
        assert again == first
        assert [t.id for t in await store.list_turns(k)] == ["t1"]
        # Without a key the same request is a new submission (and here refused as busy).
        with pytest.raises(SessionBusy):
            await store.enqueue_turn(k, turn_id="t3", input="hello", policy="reject")

    async def test_the_key_with_another_request_is_refused(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(
            k, turn_id="t1", input="hello", policy="enqueue", idempotency=ASKED
        )
        before = await snapshot(store, k)
        other = Idempotency(ASKED.key, "digest-of-something-else")
        with pytest.raises(IdempotencyKeyReused):
            await store.enqueue_turn(
                k, turn_id="t2", input="else", policy="enqueue", idempotency=other
            )
        assert await snapshot(store, k) == before

    async def test_keys_belong_to_their_session(self, store: Store) -> None:
        mine, other_session, other_owner = key("s1"), key("s2"), key("s1", owner="bob")
        for k in (mine, other_session, other_owner):
            await new_session(store, k)
        made = [
            await store.enqueue_turn(
                k, turn_id=f"t-{n}", input="hello", policy="enqueue", idempotency=ASKED
            )
            for n, k in enumerate((mine, other_session, other_owner))
        ]
        assert len({t.id for t in made}) == 3

    async def test_concurrent_submissions_with_one_key_make_one_turn(self, store: Store) -> None:
        k = await new_session(store)
        got = await asyncio.gather(*(_submit(store, k, f"t{n}") for n in range(10)))
        assert len({t.id for t in got}) == 1
        assert len(await store.list_turns(k)) == 1

    async def test_an_ended_turn_is_still_the_answer(self, store: Store) -> None:
        k = await new_session(store)
        await store.enqueue_turn(
            k, turn_id="t1", input="hello", policy="enqueue", idempotency=ASKED
        )
        ended = await store.end_waiting_turn(k, "t1", "cancelled")
        assert ended is not None
        again = await _submit(store, k, "t2")
        assert again == ended and again.status == "cancelled"

    async def test_a_key_past_its_window_names_a_new_turn(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(rules, "IDEMPOTENCY_WINDOW", 0.05)
        k = await new_session(store)
        first = await _submit(store, k, "t1")
        await store.end_waiting_turn(k, "t1", "cancelled")
        await asyncio.sleep(0.1)
        fresh = await _submit(store, k, "t2")
        assert fresh.id == "t2" != first.id
        # And from then on the key answers with the new turn.
        assert (await _submit(store, k, "t3")).id == "t2"
