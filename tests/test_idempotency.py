"""Idempotent submission from Python (DESIGN §4): a retried call makes no second turn."""

from __future__ import annotations

import asyncio

import pytest

from tests.helpers import key, running
from tether import Agent, IdempotencyKeyReused
from tether.store.protocol import Store
from tether.testing import EchoModel


async def test_a_retried_call_gets_the_first_answer_and_runs_nothing(store: Store) -> None:
    model = EchoModel()
    agent = Agent(name="a", model=model)
    async with running(store, agent) as rt:
        replies = await asyncio.gather(
            *(rt.chat(agent, "pay once", session_id="s", idempotency_key="pay-7") for _ in range(5))
        )
        assert len(set(replies)) == 1
        assert len(model.requests) == 1
        assert [t.input for t in await rt.store.list_turns(key("s"))] == ["pay once"]
        with pytest.raises(IdempotencyKeyReused):
            await rt.chat(agent, "pay twice", session_id="s", idempotency_key="pay-7")
        assert len(await rt.store.list_turns(key("s"))) == 1
