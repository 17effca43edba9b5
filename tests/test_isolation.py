"""Sessions never cross: many owners at once, and many callers on one session."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import tether.embedded
from tests.helpers import all_items, running
from tether import Agent, Principal, SyncInAsyncContext
from tether.models.base import ModelRequest
from tether.records import SessionKey
from tether.store.protocol import Store
from tether.testing import EchoModel, ScriptedModel, last_user_text


async def test_fifty_owners_concurrently_never_see_each_other(store: Store) -> None:
    model = EchoModel()
    agent = Agent(name="a", model=model)
    owners = [Principal("acme", f"user{i:02d}") for i in range(50)]
    canary = {p.user: f"canary-{p.user}-{i * 7919:x}" for i, p in enumerate(owners)}

    async with running(store, agent) as rt:

        async def converse(p: Principal) -> None:
            # Every owner uses the same session id: it must still be 50 separate sessions.
            for n in range(2):
                await rt.chat(agent, f"{canary[p.user]} #{n}", session_id="chat", principal=p)

        await asyncio.gather(*(converse(p) for p in owners))

        for p in owners:
            items = await all_items(rt, SessionKey(p.tenant, p.user, "chat"))
            assert len(items) == 4
            text = " ".join(i.content for i in items)
            assert canary[p.user] in text
            others = [c for u, c in canary.items() if u != p.user and c in text]
            assert others == [], f"{p.user} history holds {others}"

    assert len(model.requests) == 100
    for request in model.requests:
        prompt = " ".join(m.content for m in request.messages)
        owner = last_user_text(request).split("-")[1]
        leaked = [c for u, c in canary.items() if u != owner and c in prompt]
        assert leaked == [], f"prompt for {owner} contains {leaked}"


def history_digest(request: ModelRequest) -> str:
    """Reply naming every earlier user message the model was shown, then the new one."""
    users = [m.content for m in request.messages if m.role == "user"]
    return f"saw [{', '.join(users[:-1])}] then {users[-1]}"


def _assert_serial(items_text: list[tuple[str, str]], replies: dict[str, str]) -> None:
    """Strict user/assistant alternation, and each reply saw exactly the turns before it."""
    kinds = [k for k, _ in items_text]
    assert kinds == ["user", "assistant"] * (len(kinds) // 2)
    earlier: list[str] = []
    for n in range(0, len(items_text), 2):
        user, reply = items_text[n][1], items_text[n + 1][1]
        assert reply == f"saw [{', '.join(earlier)}] then {user}"
        assert replies[user] == reply
        earlier.append(user)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


async def test_twenty_tasks_and_twenty_threads_on_one_agent_serialize(data_dir: Path) -> None:
    agent = Agent(
        name="serial",
        model=ScriptedModel(default=history_digest, context_window=100_000),
        memory={"session_id": "one"},
    )
    replies: dict[str, str] = {}

    async def task_call(n: int) -> None:
        replies[f"task {n}"] = await agent.achat(f"task {n}")

    def thread_call(n: int) -> None:
        replies[f"thread {n}"] = agent.chat(f"thread {n}")

    threads = [threading.Thread(target=thread_call, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    await asyncio.gather(*(task_call(n) for n in range(20)))
    for t in threads:
        await asyncio.to_thread(t.join)

    assert len(replies) == 40
    rt = tether.embedded.default_runtime()
    k = SessionKey("local", "local", "one")
    items = await asyncio.wrap_future(
        asyncio.run_coroutine_threadsafe(rt.runtime.store.list_items(k, limit=1000), rt.loop)
    )
    assert len(items) == 80
    _assert_serial([(i.kind, i.content) for i in items], replies)
    assert (data_dir / "tether.db").exists()


async def test_blocking_chat_inside_event_loop_raises(data_dir: Path) -> None:
    agent = Agent(name="x", model=EchoModel())
    with pytest.raises(SyncInAsyncContext):
        agent.chat("hi")


def test_agent_without_session_id_gets_its_own_conversation(data_dir: Path) -> None:
    model = EchoModel()
    one = Agent(name="x", model=model)
    two = Agent(name="x", model=model)
    one.chat("first of one")
    two.chat("first of two")
    assert one.chat("second of one") == (
        "user:first of one | assistant:user:first of one | user:second of one"
    )
    assert one.session_id != two.session_id
