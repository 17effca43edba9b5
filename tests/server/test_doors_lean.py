"""The doors that open a session as they send (``/api/chat``, ``POST /agent``, OpenAI's chat
completions): a conversation's next message costs the store what a native turn does, and the
outcomes are those of opening the session first (made when missing, afresh when expired, the
app's first agent for a session whose agent is not served here, a 404 where the door makes
no sessions)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tether.agent import Agent
from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.runtime import Runtime
from tether.server.app import create_app
from tether.server.settings import Settings
from tether.testing import ScriptedModel

T = TypeVar("T")


def seen(request: Any) -> str:
    """What the model saw: the earlier user and assistant messages, then the new one."""
    said = [m.content for m in request.messages if m.role in ("user", "assistant")]
    return f"saw {said[:-1]} then {said[-1]}"


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    agents = [
        Agent(name="first", model=ScriptedModel(default=seen)),
        Agent(name="second", model=ScriptedModel(default=lambda r: "from second")),
    ]
    app = create_app(Settings(data_dir=tmp_path), agents=agents)
    runtime: Runtime = app.state.tether.runtime
    async with app.router.lifespan_context(app):
        # A lease lingers for the whole test: each next message comes while it is held.
        runtime.scheduler.linger = 60.0
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c, runtime


def counting(runtime: Runtime, calls: list[str], *names: str) -> None:
    store = runtime.store
    for name in names:
        method: Callable[..., Awaitable[Any]] = getattr(store, name)

        def logged(
            *args: Any, _m: Callable[..., Awaitable[T]] = method, _n: str = name, **kwargs: Any
        ) -> Awaitable[T]:
            calls.append(_n)
            return _m(*args, **kwargs)

        setattr(store, name, logged)


def key(sid: str) -> SessionKey:
    return SessionKey.of(LOCAL_PRINCIPAL, sid)


async def history(runtime: Runtime, sid: str) -> list[str]:
    return [i.content for i in await runtime.store.list_items(key(sid))]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", lambda text: {"message": text, "session_id": "lean"}),
        ("/agent", lambda text: {"message": text, "session_id": "lean"}),
    ],
)
async def test_a_conversations_next_message_neither_reads_nor_writes_its_session_first(
    tmp_path: Path, path: str, body: Callable[[str], dict[str, Any]]
) -> None:
    async with serving(tmp_path) as (c, runtime):
        calls: list[str] = []
        counting(runtime, calls, "get_session", "create_session")
        per_message: list[list[str]] = []
        for text in ("one", "two", "three"):
            calls.clear()
            r = await c.post(path, json=body(text))
            assert r.status_code == 200, r.text
            per_message.append(list(calls))
        # The first message makes the session (its agent then known here); the next ones
        # cost neither a read nor a write of it.
        assert per_message[0].count("create_session") == 1
        assert per_message[1] == [] and per_message[2] == []
        assert await history(runtime, "lean") == [
            "one",
            "saw [] then one",
            "two",
            "saw ['one', 'saw [] then one'] then two",
            "three",
            "saw ['one', 'saw [] then one', 'two', "
            "\"saw ['one', 'saw [] then one'] then two\"] then three",
        ]


async def test_an_expired_sessions_id_on_api_chat_starts_afresh(tmp_path: Path) -> None:
    async with serving(tmp_path) as (c, runtime):
        await runtime.sessions.create(key("old"), "first", ttl_seconds=0.2)
        turn = await runtime.scheduler.submit(key("old"), "my secret is 42")
        assert (await runtime.scheduler.wait(key("old"), turn.id)).status == "completed"
        await asyncio.sleep(0.3)
        r = await c.post("/api/chat", json={"message": "what is my secret?", "session_id": "old"})
        assert r.status_code == 200, r.text
        assert r.json()["response"] == "saw [] then what is my secret?"
        assert await history(runtime, "old") == ["what is my secret?", r.json()["response"]]


async def test_a_session_whose_agent_is_not_served_here_is_answered_by_the_first(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (c, runtime):
        await runtime.sessions.create(key("retired"), "retired-agent")
        r = await c.post("/api/chat", json={"message": "hello", "session_id": "retired"})
        assert r.status_code == 200, r.text
        assert (r.json()["agent_name"], r.json()["response"]) == ("first", "saw [] then hello")
        # A message that names an agent gets that one, on the same session.
        named = {"message": "and you?", "session_id": "retired", "agent_name": "second"}
        r = await c.post("/api/chat", json=named)
        assert (r.json()["agent_name"], r.json()["response"]) == ("second", "from second")


async def test_openai_chat_completions_on_a_session_reads_nothing_first(tmp_path: Path) -> None:
    async with serving(tmp_path) as (c, runtime):
        calls: list[str] = []
        counting(runtime, calls, "get_session", "create_session")

        def completion(text: str, sid: str) -> Awaitable[httpx.Response]:
            body = {"model": "first", "messages": [{"role": "user", "content": text}]}
            return c.post("/v1/chat/completions", json=body, headers={"X-Tether-Session": sid})

        # The face makes no session for an id that is not there: a 404, and nothing made.
        r = await completion("hello", "nobody")
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "session_not_found"
        assert await runtime.store.get_session(key("nobody")) is None
        await runtime.sessions.create(key("chat"), "first")
        answers = []
        for text in ("one", "two", "three"):
            calls.clear()
            r = await completion(text, "chat")
            assert r.status_code == 200, r.text
            assert r.headers["X-Tether-Session"] == "chat"
            answers.append(r.json()["choices"][0]["message"]["content"])
        assert calls == []  # the third message, as the lease lingers: no read
        assert answers[1] == "saw ['one', 'saw [] then one'] then two"


def a2a_send(text: str, context: str) -> dict[str, Any]:
    message = {"messageId": f"m-{text}", "role": "ROLE_USER", "parts": [{"text": text}]}
    params = {"message": {**message, "contextId": context}}
    return {"jsonrpc": "2.0", "id": text, "method": "SendMessage", "params": params}


async def test_the_faces_continuing_a_conversation_read_nothing_first(tmp_path: Path) -> None:
    """A2A's SendMessage with a contextId and the Responses API with a conversation: the
    admission finds the session; a context or conversation that is not there is refused in
    each protocol's words, and none is made."""
    async with serving(tmp_path) as (c, runtime):
        calls: list[str] = []
        counting(runtime, calls, "get_session", "create_session")

        r = await c.post("/a2a/first", json=a2a_send("hi", "no-such-context"))
        assert r.json()["error"]["code"] == -32001, r.text  # TaskNotFoundError
        body = {"model": "first", "input": "hi", "conversation": "no-such-conversation"}
        r = await c.post("/v1/responses", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (404, "conversation_not_found")
        for sid in ("no-such-context", "no-such-conversation"):
            assert await runtime.store.get_session(key(sid)) is None

        await runtime.sessions.create(key("a2a"), "first")
        await runtime.sessions.create(key("responses"), "first")
        for text in ("one", "two", "three"):
            calls.clear()
            r = await c.post("/a2a/first", json=a2a_send(text, "a2a"))
            task = r.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED", r.text
            body = {"model": "first", "input": text, "conversation": "responses"}
            r = await c.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
        assert calls == []  # the third messages, as the leases linger: no read, no write
        for sid in ("a2a", "responses"):
            said = await history(runtime, sid)
            assert said[-2:] == ["three", f"saw {said[:-2]} then three"]


async def test_ag_ui_and_langgraph_runs_on_a_thread_read_and_write_no_session_first(
    tmp_path: Path,
) -> None:
    """AG-UI runs and LangGraph runs on a thread that exists: the admission finds its session;
    the first AG-UI run makes the thread's session, and the later ones make and read none."""
    from ag_ui.core import RunAgentInput, UserMessage

    def agui(thread: str, *said: str) -> str:
        run = RunAgentInput(
            thread_id=thread,
            run_id=f"run-{len(said)}",
            messages=[UserMessage(id=f"m{n}", content=t) for n, t in enumerate(said)],
        )
        return run.model_dump_json(by_alias=True)

    async with serving(tmp_path) as (c, runtime):
        calls: list[str] = []
        counting(runtime, calls, "get_session", "create_session")
        per_run: list[list[str]] = []
        said: list[str] = []
        for text in ("one", "two", "three"):
            said.append(text)
            calls.clear()
            headers = {"content-type": "application/json", "accept": "text/event-stream"}
            r = await c.post("/agui/first", content=agui("ag-thread", *said), headers=headers)
            assert r.status_code == 200 and "RUN_FINISHED" in r.text, r.text
            per_run.append(list(calls))
        assert per_run[0].count("create_session") == 1
        assert per_run[1] == [] and per_run[2] == []
        assert (await history(runtime, "ag-thread"))[-2:] == [
            "three",
            "saw ['one', 'saw [] then one', 'two', \"saw ['one', 'saw [] then one'] then two\"]"
            " then three",
        ]

        made = await c.post("/lg/threads", json={"thread_id": "lg-thread"})
        assert made.status_code == 200, made.text
        for text in ("one", "two"):
            calls.clear()
            body = {
                "assistant_id": "first",
                "input": {"messages": [{"role": "user", "content": text}]},
            }
            r = await c.post("/lg/threads/lg-thread/runs/wait", json=body)
            assert r.status_code == 200, r.text
        assert calls == []  # the second run, as the lease lingers: no read, no write
        assert (await history(runtime, "lg-thread"))[
            -1
        ] == "saw ['one', 'saw [] then one'] then two"
        # A run on a thread that is not there is a 404, and makes none.
        body = {"assistant_id": "first", "input": {"messages": [{"role": "user", "content": "x"}]}}
        r = await c.post("/lg/threads/no-thread/runs/wait", json=body)
        assert r.status_code == 404, r.text
        assert await runtime.store.get_session(key("no-thread")) is None


async def test_an_expired_ag_ui_thread_starts_afresh_whatever_it_waited_for(
    tmp_path: Path,
) -> None:
    """The refusal of a message to a thread waiting for a decision does not hold for an expired
    thread: its id starts afresh (the pending decision is stood in for here: it is only read)."""
    from types import SimpleNamespace

    from ag_ui.core import RunAgentInput, UserMessage

    async with serving(tmp_path) as (c, runtime):
        # Expired only once the first message has been refused: a TTL that runs out while the
        # machine is slow would make the first message start afresh too.
        await runtime.sessions.create(key("old-thread"), "first", ttl_seconds=3600)
        waiting = SimpleNamespace(call_id="call-1", turn_id="t-old")

        async def pending(*args: Any, **kwargs: Any) -> list[Any]:
            return [waiting]

        runtime.scheduler.decisions = pending  # type: ignore[method-assign]
        run = RunAgentInput(
            thread_id="old-thread",
            run_id="run-1",
            messages=[UserMessage(id="m0", content="hello")],
        )
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        live = await c.post(
            "/agui/first", content=run.model_dump_json(by_alias=True), headers=headers
        )
        assert "RUN_ERROR" in live.text and "awaiting_input" in live.text  # still waiting
        await runtime.sessions.update(key("old-thread"), ttl_seconds=0.01)
        await asyncio.sleep(0.05)
        r = await c.post("/agui/first", content=run.model_dump_json(by_alias=True), headers=headers)
        assert "RUN_FINISHED" in r.text, r.text
        assert await history(runtime, "old-thread") == ["hello", "saw [] then hello"]
