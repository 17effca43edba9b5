"""The Session facade (DESIGN §10): embedded sessions with state and TTL, and remote ones."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import tether.embedded
from tether import (
    Agent,
    ConfigError,
    IdempotencyKeyReused,
    InvalidInput,
    MemoryConfig,
    Principal,
    Session,
    SessionClosed,
    SessionNotFound,
    ToolContext,
    TurnFailed,
    tool,
)
from tether.errors import MiddlewareFailed
from tether.models.base import ModelRequest
from tether.records import SessionRecord
from tether.testing import EchoModel, ScriptedModel
from tether.testing.scripted import Call, Fail, Slow, ToolCalls


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TETHER_DATA_DIR", str(tmp_path / "data"))
    yield tmp_path / "data"
    tether.embedded.shutdown()


def test_session_agent_persists_state_and_context(data_dir: Path) -> None:
    session = Session(session_id="chat_123", user_id="user_456", session_ttl=3600)
    helper = session.Agent(name="Assistant", instructions="be brief", model=EchoModel())
    assert helper.chat("hello") == "user:hello"
    assert helper.chat("again") == "user:hello | assistant:user:hello | user:again"
    context = session.get_context()
    assert context["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "user:hello", "agent": "Assistant"},
        {"role": "user", "content": "again"},
        {
            "role": "assistant",
            "content": "user:hello | assistant:user:hello | user:again",
            "agent": "Assistant",
        },
    ]
    assert (context["session_id"], context["user_id"]) == ("chat_123", "user_456")
    assert (context["message_count"], context["agents"]) == (4, ["Assistant"])
    assert context["created_at"] <= context["updated_at"]
    assert context["expires_at"] == pytest.approx(context["created_at"] + 3600, abs=5)
    session.save_state({"step": 2, "topic": "greetings"})
    assert Session(session_id="chat_123", user_id="user_456").restore_state() == {
        "step": 2,
        "topic": "greetings",
    }
    remaining = session.time_to_expiry()
    assert remaining is not None and 3590 < remaining <= 3600
    assert not session.is_expired()
    # Another user's session with the same id is another conversation.
    other = Session(session_id="chat_123", user_id="someone_else")
    nothing = other.get_context()
    assert nothing["messages"] == [] and nothing["message_count"] == 0
    assert nothing["created_at"] is None and other.restore_state() == {}
    session.close()


def test_expired_session_refuses_turns(data_dir: Path) -> None:
    session = Session(session_id="short", session_ttl=0.2)
    session.Agent(name="A", model=EchoModel())
    session.chat("first")
    time.sleep(0.3)
    assert session.is_expired()
    with pytest.raises(SessionNotFound):
        session.chat("too late")


def test_an_expired_sessions_history_state_and_memory_are_not_read_back(
    data_dir: Path,
) -> None:
    # Before, they were read back until the sweep (every 60 s) deleted them; over HTTP the
    # session is a 404 at once.
    session = Session(session_id="gone", user_id="u-gone", session_ttl=0.5)
    session.Agent(name="A", model=EchoModel())
    session.chat("secret history")
    session.save_state({"step": 3})
    session.add_memory("session fact guava", scope="session")
    assert session.search_memory("guava") and session.get_context()["messages"]
    time.sleep(0.6)
    again = Session(session_id="gone", user_id="u-gone")
    again.Agent(name="A", model=EchoModel())
    for s in (session, again):
        assert s.is_expired()
        context = s.get_context()
        assert (context["messages"], context["state"], context["message_count"]) == ([], {}, 0)
        assert context["expires_at"] is not None  # it says when it ended
        assert s.restore_state() == {}
        assert s.search_memory("guava") == []


async def test_astream_yields_events_until_the_end(data_dir: Path) -> None:
    agent = Agent(name="s", model=ScriptedModel("one two three"))
    events = [e async for e in agent.astream("go")]
    types = [e.type for e in events]
    assert types[0] == "turn.queued" and types[-1] == "turn.ended"
    assert "".join(e.data["text"] for e in events if e.type == "message.delta") == ("one two three")
    assert events[-1].data["status"] == "completed"


def test_memory_and_knowledge_as_the_first_calls_of_a_process(
    data_dir: Path, tmp_path: Path
) -> None:
    session = Session(session_id="first-1", user_id="u-first")
    # Each of these may be the very first thing a program does: the store opens on demand.
    assert Session(session_id="k", user_id="u-first").search_knowledge("vacation") == []
    handbook = tmp_path / "handbook.md"
    handbook.write_text("# Leave\n\nStaff get 27 days of paid leave.\n")
    assert session.add_knowledge(handbook)["chunks"] == 1
    item = session.add_memory("The user prefers metric units.")
    assert item.startswith("mem_")
    found = Session(session_id="other", user_id="u-first").search_memory("units")
    assert [h["content"] for h in found] == ["The user prefers metric units."]
    hits = session.search_knowledge("paid leave days")
    assert "27 days" in hits[0]["content"]
    # A mistyped file name is an error, not a one-line document; text is indexed as text.
    with pytest.raises(FileNotFoundError):
        session.add_knowledge("handbok.md")
    with pytest.raises(FileNotFoundError):
        session.add_knowledge("docs/handbok")
    # Each text is a document of its own, named by its content: two texts keep both.
    meals = session.add_knowledge("Meals and/or taxis are reimbursed.")
    hotels = session.add_knowledge("Hotels are booked by the travel desk.")
    assert meals["name"].startswith("text-") and meals["name"] != hotels["name"]
    assert "travel desk" in session.search_knowledge("who books hotels")[0]["content"]
    assert "taxis" in session.search_knowledge("are taxis reimbursed")[0]["content"]
    # Another user sees none of it.
    stranger = Session(session_id="first-1", user_id="someone-else")
    assert stranger.search_memory("units") == []
    assert stranger.search_knowledge("paid leave days") == []


def stored(session: Session) -> SessionRecord | None:
    rt = tether.embedded.default_runtime()
    record: SessionRecord | None = rt.call(rt.runtime.get_session(session.key))
    return record


def test_a_closed_session_refuses_every_use(data_dir: Path, tmp_path: Path) -> None:
    session = Session(session_id="closing", user_id="u-close")
    helper = session.Agent(name="A", model=EchoModel())
    assert helper.chat("hello") == "user:hello"
    session.close()
    session.close()  # idempotent
    note = tmp_path / "note.md"
    note.write_text("a note")
    refused: list[Callable[[], object]] = [
        lambda: session.chat("more"),
        lambda: session.save_state({"step": 3}),
        lambda: session.restore_state(),
        lambda: session.get_context(),
        lambda: session.add_memory("Prefers tea"),
        lambda: session.search_memory("tea"),
        lambda: session.add_knowledge(note),
        lambda: session.search_knowledge("note"),
        lambda: session.Agent(name="B", model=EchoModel()),
        lambda: session.clear(),
        lambda: session.is_expired(),
        lambda: session.time_to_expiry(),
        lambda: helper.chat("its agent is closed with it"),
    ]
    for use in refused:
        with pytest.raises(SessionClosed, match="closing"):
            use()
    # Nothing was written by the refused calls; the stored conversation is intact.
    again = Session(session_id="closing", user_id="u-close")
    assert again.restore_state() == {}
    assert again.get_context()["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "user:hello", "agent": "A"},
    ]
    assert again.search_memory("tea") == []


async def test_a_closed_session_refuses_achat(data_dir: Path) -> None:
    session = Session(session_id="closing-async")
    session.Agent(name="A", model=EchoModel())
    session.close()
    with pytest.raises(SessionClosed):
        await session.achat("hi")


def test_closing_a_remote_session_releases_its_client_and_refuses_use() -> None:
    # Nothing listens there: the client is lazy, and no call may reach the network after close.
    remote = Session(agent_url="http://127.0.0.1:9", agent_name="echo", session_id="r-1")
    held = remote._client
    assert held is not None
    remote.close()
    assert held._http.is_closed
    remote.close()
    with pytest.raises(SessionClosed):
        remote.chat("hi")
    with pytest.raises(SessionClosed):
        remote.add_memory("x")


def instructions_of(request: ModelRequest) -> str:
    return request.messages[0].content.splitlines()[0]


def test_state_and_memory_before_any_agent_bind_no_phantom_agent(data_dir: Path) -> None:
    # Shared agent memory of an agent that happens to be called "assistant".
    rt = tether.embedded.default_runtime()
    admin = Principal("local", "u-early", frozenset({"admin"}))
    rt.call(rt.runtime.start())
    rt.call(rt.runtime.memory.add(admin, "assistant-only fact", scope="agent", agent="assistant"))
    session = Session(session_id="early", user_id="u-early")
    session.save_state({"topic": "travel"})
    session.add_memory("Prefers trains", scope="session")
    record = stored(session)
    assert record is not None and record.agent == ""  # no agent has been named yet
    # Before any agent there is no agent scope to read or write.
    assert [h["content"] for h in session.search_memory("fact trains")] == ["Prefers trains"]
    with pytest.raises(InvalidInput, match="agent"):
        session.add_memory("x", scope="agent")
    # The PraisonAI order: state first, then the agent, then chat.
    writer = session.Agent(
        name="writer",
        instructions="You write travel guides.",
        model=ScriptedModel(default=instructions_of),
    )
    assert writer.chat("plan a trip") == "You write travel guides."
    assert session.chat("and back?") == "You write travel guides."
    assert session.restore_state() == {"topic": "travel"}
    turns = rt.call(rt.runtime.sessions.turns(session.key))
    assert [t.agent.name for t in turns if t.agent] == ["writer", "writer"]


@tool
def lookup(word: str) -> str:
    """Look a word up."""
    return word.upper()


def test_get_context_returns_the_newest_messages_in_order(data_dir: Path) -> None:
    model = ScriptedModel(
        "a0",
        Fail("down", transient=False),
        ToolCalls(Call("lookup", {"word": "x"})),
        "a2",
        "a3",
    )
    session = Session(session_id="long", user_id="u-long")
    agent = session.Agent(name="A", model=model, tools=[lookup])
    assert agent.chat("m0") == "a0"
    with pytest.raises(TurnFailed):
        agent.chat("m1")
    assert agent.chat("m2") == "a2"
    assert agent.chat("m3") == "a3"
    # The newest messages, oldest first; the failed turn's and the tool items left out.
    assert session.get_context(limit=3)["messages"] == [
        {"role": "assistant", "content": "a2", "agent": "A"},
        {"role": "user", "content": "m3"},
        {"role": "assistant", "content": "a3", "agent": "A"},
    ]
    context = session.get_context()
    assert [m["content"] for m in context["messages"]] == ["m0", "a0", "m2", "a2", "m3", "a3"]
    assert context["message_count"] == 6  # the failed turn's items do not count
    with pytest.raises(ConfigError):
        session.get_context(limit=0)


def test_session_options_are_checked_when_the_session_is_made(data_dir: Path) -> None:
    for bad in (-1, 0, float("nan"), float("inf"), "3600", True):
        with pytest.raises(ValueError, match="session_ttl"):
            Session(session_id="ttl", session_ttl=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):  # the same error, tether's own type
        Session(session_id="ttl", session_ttl=-5)
    assert Session(session_id="ttl-default").time_to_expiry() is None


def test_time_to_expiry_never_goes_below_zero(data_dir: Path) -> None:
    session = Session(session_id="short", user_id="u-short", session_ttl=0.2)
    session.save_state({"x": 1})  # stores the session, and its expiry
    time.sleep(0.4)
    assert session.time_to_expiry() == 0.0
    assert session.is_expired()


def test_a_session_is_a_context_manager(data_dir: Path) -> None:
    with Session(session_id="with", user_id="u-with") as session:
        helper = session.Agent(name="A", model=EchoModel())
        assert helper.chat("hi") == "user:hi"
    with pytest.raises(SessionClosed):
        session.chat("more")
    with Session(session_id="with", user_id="u-with") as again:
        assert again.get_context()["message_count"] == 2


def test_middleware_runs_after_every_turn_of_every_agent(data_dir: Path) -> None:
    seen: list[tuple[str, str]] = []

    def log(message: str, response: str) -> str:
        seen.append((message, response))
        return response

    async def shout(message: str, response: str) -> str:
        return response.upper()

    model = EchoModel()
    with Session(session_id="mw", user_id="u-mw", middleware=[log, shout]) as session:
        researcher = session.Agent(name="researcher", model=model)
        writer = session.Agent(name="writer", model=model)
        assert researcher.chat("find") == "USER:FIND"
        # The writer sees the conversation as stored (not as the middleware changed it).
        assert writer.chat("write") == "USER:FIND | ASSISTANT:USER:FIND | USER:WRITE"
        assert seen == [
            ("find", "user:find"),
            ("write", "user:find | assistant:user:find | user:write"),
        ]
        # The stored history holds what the agents said; middleware shapes the caller's copy.
        assert session.get_context()["messages"][1]["content"] == "user:find"


async def test_middleware_in_the_async_path(data_dir: Path) -> None:
    async def tag(message: str, response: str) -> str:
        return f"[{response}]"

    with Session(session_id="mw-async", user_id="u-mw", middleware=[tag]) as session:
        agent = session.Agent(name="A", model=EchoModel())
        assert await agent.achat("hi") == "[user:hi]"
        assert await session.achat("again") == f"[{'user:hi | assistant:user:hi | user:again'}]"


def test_a_failing_middleware_is_a_clear_error_that_loses_nothing(data_dir: Path) -> None:
    def broken(message: str, response: str) -> str:
        raise RuntimeError("the audit log is down")

    with Session(session_id="mw-broken", user_id="u-mw", middleware=[broken]) as session:
        agent = session.Agent(name="A", model=EchoModel())
        with pytest.raises(MiddlewareFailed, match="broken") as failed:
            agent.chat("hi")
        assert failed.value.reply == "user:hi"
        assert isinstance(failed.value.__cause__, RuntimeError)
        assert session.get_context()["message_count"] == 2  # the turn is stored
    with pytest.raises(ConfigError):
        Session(session_id="mw-bad", middleware=["not a function"])  # type: ignore[list-item]


def test_session_agents_take_memory_and_knowledge_as_documented(data_dir: Path) -> None:
    session = Session(session_id="opts", user_id="u-opts")
    plain = session.Agent(name="A", model=EchoModel(), memory=True, knowledge=True)
    assert plain.memory.session_id == "opts" and plain.memory.knowledge == ("knowledge",)
    quiet = session.Agent(name="B", model=EchoModel(), memory=False, knowledge=False)
    assert quiet.memory.scopes == () and quiet.memory.knowledge == ()
    configured = session.Agent(
        name="C", model=EchoModel(), memory=MemoryConfig(remember=True), knowledge=["handbook"]
    )
    assert configured.memory.remember and configured.memory.knowledge == ("handbook",)
    assert configured.memory.session_id == "opts"  # the session's, whatever the config says
    with pytest.raises(ConfigError):
        session.Agent(name="D", memory="yes please")
    session.close()


def test_close_waits_for_a_turn_under_way_then_cancels_past_its_bound(data_dir: Path) -> None:
    import threading

    session = Session(session_id="closing-wait", user_id="u-cw")
    agent = session.Agent(name="A", model=ScriptedModel(default=Slow("w " * 10, delay=0.05)))
    replies: list[str] = []
    worker = threading.Thread(target=lambda: replies.append(agent.chat("go")))
    worker.start()
    time.sleep(0.2)  # the reply streams (0.5 s in all)
    session.close()  # waits for it
    worker.join(5)
    assert replies == ["w " * 10]
    with pytest.raises(SessionClosed):
        session.get_context()
    # Past its bound, a turn still under way is cancelled, not abandoned.
    slow = Session(session_id="closing-cancel", user_id="u-cw")
    stuck = slow.Agent(name="B", model=ScriptedModel(default=Slow("w " * 200, delay=0.05)))
    failures: list[BaseException] = []

    def chat() -> None:
        try:
            stuck.chat("go")
        except TurnFailed as exc:
            failures.append(exc)

    worker = threading.Thread(target=chat)
    worker.start()
    time.sleep(0.2)
    slow.close(wait=0.2)
    worker.join(10)
    [failed] = failures
    assert isinstance(failed, TurnFailed) and failed.turn.status == "cancelled"


def test_save_state_without_arguments_saves_what_the_session_is(data_dir: Path) -> None:
    session = Session(session_id="bundle", user_id="u-b", session_ttl=600)
    session.save_state({"step": 1})
    session.Agent(name="helper", instructions="be brief", model="openai:gpt-4o-mini")
    session.save_state()
    first = session.restore_state()
    session.save_state()  # idempotent
    assert session.restore_state() == first
    assert first["step"] == 1  # what the state held stays
    bundle = first["session"]
    assert (bundle["session_id"], bundle["user_id"], bundle["session_ttl"]) == (
        "bundle",
        "u-b",
        600,
    )
    [helper] = bundle["agents"]
    assert (helper["name"], helper["instructions"], helper["model"]) == (
        "helper",
        "be brief",
        "openai:gpt-4o-mini",
    )
    assert Session(session_id="bundle", user_id="u-b").restore_state() == first


def test_session_memory_and_knowledge_options(data_dir: Path, tmp_path: Path) -> None:
    research = {"vector_store": {"provider": "chroma", "config": {"collection_name": "research"}}}
    session = Session(session_id="kn", user_id="u-kn", knowledge=research, memory=True)
    assert session.collection == "research"
    agent = session.Agent(name="A", model=EchoModel(), knowledge=True)
    assert agent.memory.knowledge == ("research",)
    session.add_knowledge("Important finding: the moon has quakes.")
    session.add_knowledge("Important finding: Mars has dust storms.")
    hits = session.search_knowledge("dust storms")
    assert "Mars" in hits[0]["content"]
    assert session.search_knowledge("moon quakes", collection="knowledge") == []
    remembering = Session(session_id="mem", user_id="u-kn", memory=MemoryConfig(remember=True))
    assert remembering.Agent(name="B", model=EchoModel()).memory.remember
    forgetful = Session(session_id="none", user_id="u-kn", memory=False, knowledge=False)
    quiet = forgetful.Agent(name="C", model=EchoModel())
    assert quiet.memory.scopes == () and quiet.memory.knowledge == ()
    bad = {"vector_store": {"config": {"collection_name": "no spaces please"}}}
    with pytest.raises(ConfigError):
        Session(session_id="bad", knowledge=bad)


def test_a_reply_names_its_turn_and_the_agent_that_answered(data_dir: Path) -> None:
    billing = Agent(name="billing", model=ScriptedModel(default=lambda r: "billing here"))
    session = Session(session_id="meta", user_id="u-meta")
    session.Agent(
        name="triage",
        model=ScriptedModel(ToolCalls(Call("transfer_to_billing")), default="triage here"),
        handoffs=[billing],
    )
    reply = session.chat("my bill")
    assert reply == "billing here"
    meta = reply["metadata"]
    assert (meta["agent_name"], meta["session_id"], meta["status"]) == (
        "billing",
        "meta",
        "completed",
    )
    assert reply.turn is not None and reply.turn == meta["turn_id"]
    # Both agents that ran its turns, the one it was sent to first.
    assert session.get_context()["agents"] == ["triage", "billing"]
    # An Agent's own chat says the same.
    plain = Agent(name="plain", model=EchoModel())
    said = plain.chat("hi")
    assert said["metadata"]["agent_name"] == "plain" and said.turn is not None


def test_chat_refuses_what_is_not_a_message_or_a_policy(data_dir: Path) -> None:
    session = Session(session_id="bad-input", user_id="u-bad")
    agent = session.Agent(name="A", model=EchoModel())
    for bad in (None, b"bytes", ["a list"], {"a": 1}, 5):
        with pytest.raises(InvalidInput, match="text"):
            agent.chat(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="policy"):
        agent.chat("hi", policy="bogus")  # type: ignore[arg-type]
    # A NUL is refused on every store (PostgreSQL's text cannot hold one; SQLite took it), as
    # HTTP refuses it; an idempotency key is text.
    with pytest.raises(InvalidInput, match="NUL"):
        agent.chat("a\x00b")
    with pytest.raises(InvalidInput, match="idempotency key"):
        agent.chat("hi", idempotency_key=5)  # type: ignore[arg-type]
    # Nothing was stored by the refused calls.
    assert session.get_context()["message_count"] == 0
    assert agent.chat("hi") == "user:hi"


def test_a_remote_session_makes_no_local_agents() -> None:
    remote = Session(agent_url="http://127.0.0.1:9", session_id="r")
    with pytest.raises(ConfigError, match="server"):
        remote.Agent(name="helper")
    remote.close()


def test_session_arguments_that_cannot_work_are_refused_at_once() -> None:
    for bad in (42, "", " padded ", "line\nbreak", "x" * 257):
        with pytest.raises(ConfigError, match="user_id"):
            Session(session_id="s", user_id=bad)  # type: ignore[arg-type]
    assert Session(session_id="s", user_id="auth0|42").user_id == "auth0|42"
    with pytest.raises(ConfigError, match="middleware"):
        Session(session_id="s", middleware=print)  # type: ignore[arg-type]
    for timeout in ("x", -1, 0, True):
        with pytest.raises(ConfigError, match="timeout"):
            Session(agent_url="http://127.0.0.1:9", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="headers"):
        Session(agent_url="http://127.0.0.1:9", headers=["a"])  # type: ignore[arg-type]


@tool
def whoami(ctx: ToolContext) -> str:
    """Who the turn is for."""
    return f"{ctx.principal.tenant}/{ctx.principal.user} owns {ctx.session.owner}"


def _asks_whoami(request: ModelRequest) -> str | ToolCalls:
    if request.messages[-1].role == "tool":
        return f"tool said: {request.messages[-1].content}"
    return ToolCalls(Call("whoami", {}))


def test_a_sessions_tools_see_its_user(data_dir: Path) -> None:
    # Before, every Session(user_id=…)'s tools saw the process's own local user: a tool (or
    # an MCP server's headers) keyed on ctx.principal.user treated all users as one.
    model = ScriptedModel(default=_asks_whoami)
    for user in ("ua", "ub"):
        session = Session(session_id="same", user_id=user)
        session.Agent(name="who", model=model, tools=[whoami])
        assert session.chat("who am I?") == f"tool said: local/{user} owns {user}"


def test_agents_and_sessions_take_an_idempotency_key(data_dir: Path) -> None:
    """DESIGN §4 ("``idempotency_key`` in Python"): ``Agent`` and ``Session`` take it, not
    only ``Runtime.chat``; a retry gets the first call's reply and runs nothing."""
    model = EchoModel()
    with Session(session_id="idem") as session:
        agent = session.Agent("a", model=model, memory=False)
        first = session.chat("pay once", idempotency_key="pay-1")
        assert session.chat("pay once", idempotency_key="pay-1") == first
        assert agent.chat("pay once", idempotency_key="pay-1") == first
        again = asyncio.run(session.achat("pay once", idempotency_key="pay-1"))
        assert again["metadata"]["turn_id"] == first["metadata"]["turn_id"]
        assert asyncio.run(agent.achat("pay once", idempotency_key="pay-1")) == first
        assert len(model.requests) == 1
        with pytest.raises(IdempotencyKeyReused):
            agent.chat("pay twice", idempotency_key="pay-1")
        users = [m for m in session.get_context()["messages"] if m["role"] == "user"]
        assert [m["content"] for m in users] == ["pay once"]


@pytest.mark.parametrize(("leave", "code"), [("break", 0), ("raise SystemExit('left')", 1)])
def test_leaving_astream_early_leaves_nothing_behind_at_exit(
    tmp_path: Path, leave: str, code: int
) -> None:
    """``break`` out of ``agent.astream()`` (or an exception in the loop's body), then the
    script's event loop ends: the turn is cancelled on the runtime's own loop, and nothing is
    left to print "Task exception was never retrieved ... Event loop is closed" at exit."""
    script = tmp_path / "early.py"
    script.write_text(
        "import asyncio\n"
        "from tether import Agent\n"
        "from tether.testing import ScriptedModel\n"
        "from tether.testing.scripted import Slow\n"
        "agent = Agent(name='s', model=ScriptedModel(Slow('one two three four', 0.2)))\n"
        "async def main() -> None:\n"
        "    async for event in agent.astream('go'):\n"
        "        if event.type == 'message.delta':\n"
        f"            {leave}\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "TETHER_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert "never retrieved" not in done.stderr and "Traceback" not in done.stderr, done.stderr
