"""Whole turns through the openai provider against a real HTTP fake of the OpenAI API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tests.helpers import all_items, assert_paired, key, running
from tether import Agent, RetryPolicy, TurnFailed, tool
from tether.models.openai import OpenAIModel
from tether.store import InMemoryStore
from tether.testing.fake_openai import FakeError, FakeOpenAIServer, FakeToolCall

pytestmark = pytest.mark.real_model  # the fake server is reached over real HTTP

FAST_RETRY = RetryPolicy(attempts=3, initial_backoff=0.001, max_backoff=0.002)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
async def model(fake: FakeOpenAIServer) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel("fake-model", base_url=fake.base_url, api_key="k")
    yield m
    await m.aclose()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def test_streamed_text_and_continuity(fake: FakeOpenAIServer, model: OpenAIModel) -> None:
    fake.script("Hello there, Ada.", "Your name is Ada.")
    agent = Agent(name="a", model=model, instructions="sys")
    async with running(InMemoryStore(), agent) as rt:
        turn = await rt.submit(agent, "I am Ada", session_id="s")
        deltas = [
            e.data["text"]
            async for e in rt.scheduler.events(turn.key, turn.id)
            if e.type == "message.delta"
        ]
        assert len(deltas) > 1 and "".join(deltas) == "Hello there, Ada."
        assert await rt.chat(agent, "who am I?", session_id="s") == "Your name is Ada."
    sent = fake.chat_requests[1]["messages"]
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "sys"),
        ("user", "I am Ada"),
        ("assistant", "Hello there, Ada."),
        ("user", "who am I?"),
    ]


async def test_tool_call_round_trip(fake: FakeOpenAIServer, model: OpenAIModel) -> None:
    fake.script(FakeToolCall("add", json.dumps({"a": 2, "b": 40})), "It is 42.")
    agent = Agent(name="a", model=model, tools=[add])
    async with running(InMemoryStore(), agent) as rt:
        assert await rt.chat(agent, "2+40?", session_id="s") == "It is 42."
        items = await all_items(rt, key("s"))
    assert_paired(items)
    first, second = fake.chat_requests
    assert first["tools"][0]["function"]["name"] == "add"
    assistant, tool_msg = second["messages"][-2:]
    assert assistant["tool_calls"][0]["function"]["name"] == "add"
    assert tool_msg == {
        "role": "tool",
        "tool_call_id": assistant["tool_calls"][0]["id"],
        "content": "42",
    }


async def test_429_then_success(fake: FakeOpenAIServer, model: OpenAIModel) -> None:
    fake.script(FakeError(429, "slow down", times=2), "made it")
    agent = Agent(name="a", model=model, retry=FAST_RETRY)
    async with running(InMemoryStore(), agent) as rt:
        assert await rt.chat(agent, "hi", session_id="s") == "made it"
    assert len(fake.chat_requests) == 3


async def test_persistent_500_fails_the_turn(fake: FakeOpenAIServer, model: OpenAIModel) -> None:
    fake.script(FakeError(500, "database on fire", times=3), "after")
    agent = Agent(name="a", model=model, retry=FAST_RETRY)
    async with running(InMemoryStore(), agent) as rt:
        with pytest.raises(TurnFailed) as info:
            await rt.chat(agent, "doomed", session_id="s")
        assert await rt.chat(agent, "next", session_id="s") == "after"
    turn = info.value.turn
    assert (turn.status, turn.reason) == ("failed", "model_error")
    assert turn.error is not None and "HTTP 500" in turn.error
    assert len(fake.chat_requests) == 4
    last = json.dumps(fake.chat_requests[-1]["messages"])
    assert "doomed" not in last and "on fire" not in last


async def test_closing_the_runtime_closes_its_models_connections(fake: FakeOpenAIServer) -> None:
    agent = Agent(name="a", model=OpenAIModel("fake-model", base_url=fake.base_url, api_key="k"))
    async with running(InMemoryStore(), agent) as rt:
        assert await rt.chat(agent, "hi", session_id="s") == "echo: hi"
        model = agent.model
        assert isinstance(model, OpenAIModel) and model._client is not None
    # Closed on the runtime's own loop; the next use opens a new client.
    assert model._client is None
