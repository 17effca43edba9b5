"""The LangGraph Agent Server face, driven by the real ``langgraph-sdk`` against a real server."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient
from langgraph_sdk.errors import (
    AuthenticationError,
    ConflictError,
    NotFoundError,
    UnprocessableEntityError,
)

from tests.server.cli_keys import create_key
from tests.server.conftest import Server, ServerFactory
from tether.testing.fake_openai import FakeError, FakeOpenAIServer


def sdk(server: Server, key: str | None = None) -> SyncLangGraphClient:
    """A client of the face; with no key, local mode, where the SDK's key is a placeholder."""
    return get_sync_client(url=server.url + "/lg", api_key=key or "lsv2-local", timeout=60)


@pytest.fixture
def client(server: Server) -> Iterator[SyncLangGraphClient]:
    with sdk(server) as c:
        yield c


def human(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def texts(values: Any) -> list[str]:
    assert isinstance(values, dict), values
    return [m["content"] for m in values["messages"]]


def until_status(c: SyncLangGraphClient, thread_id: str, run_id: str, *wanted: str) -> str:
    """Poll the run until its status is one of ``wanted`` (bounded; no timing is asserted)."""
    status = ""
    for _ in range(1000):
        status = c.runs.get(thread_id, run_id)["status"]
        if status in wanted:
            return status
        time.sleep(0.01)
    raise AssertionError(f"run {run_id} stayed {status}")


def test_info_and_assistants_are_the_apps_agents(client: SyncLangGraphClient) -> None:
    assert client.http.get("/info")["server"] == "tether"
    found = client.assistants.search(limit=100)
    assert isinstance(found, list)
    names = [a["assistant_id"] for a in found]
    assert names[:3] == ["echo", "slow", "approver"]
    echo = client.assistants.get("echo")
    assert echo["graph_id"] == echo["name"] == "echo"
    assert client.assistants.search(graph_id="slow")[0]["assistant_id"] == "slow"
    with pytest.raises(NotFoundError) as caught:
        client.assistants.get("nobody")
    assert caught.value.body == {
        "detail": "assistant 'nobody' not found",
        "code": "assistant_not_found",
    }


def test_two_waits_on_one_thread_continue_it_without_duplicates(
    client: SyncLangGraphClient,
) -> None:
    thread = client.threads.create(metadata={"graph_id": "echo", "topic": "continuity"})
    tid = thread["thread_id"]
    assert thread["status"] == "idle" and thread["values"] == {"messages": []}
    first = client.runs.wait(tid, "echo", input=human("one"))
    assert texts(first) == ["one", "saw [] then one"]
    # The client sends the whole conversation again: only its last human message is new.
    resent = {"messages": [*first["messages"], {"role": "user", "content": "two"}]}  # type: ignore[call-overload]
    second = client.runs.wait(tid, "echo", input=resent)
    assert texts(second) == ["one", "saw [] then one", "two", "saw [one] then two"]
    ids = [m["id"] for m in second["messages"]]  # type: ignore[call-overload]
    assert len(set(ids)) == 4
    kinds = [m["type"] for m in second["messages"]]  # type: ignore[call-overload]
    assert kinds == ["human", "ai", "human", "ai"]
    state = client.threads.get_state(tid)
    assert state["values"] == second and state["next"] == [] and state["interrupts"] == []
    history = client.threads.get_history(tid)
    assert [len(h["values"]["messages"]) for h in history] == [4, 2]  # type: ignore[call-overload]
    parent = history[0]["parent_checkpoint"]
    assert parent is not None and parent == history[1]["checkpoint"]
    runs = client.runs.list(tid)
    assert [r["status"] for r in runs] == ["success", "success"]
    metadata = client.threads.get(tid)["metadata"]
    assert metadata is not None and metadata["topic"] == "continuity"


def test_a_streamed_run_sends_metadata_values_and_tokens_then_ends(
    client: SyncLangGraphClient,
) -> None:
    tid = client.threads.create()["thread_id"]
    client.runs.wait(tid, "echo", input=human("before"))
    parts = list(
        client.runs.stream(
            tid, "echo", input=human("hello there"), stream_mode=["values", "messages-tuple"]
        )
    )
    events = [p.event for p in parts]
    assert events[0] == "metadata" and events[-1] == "end"
    run_id = parts[0].data["run_id"]
    assert parts[0].data["thread_id"] == tid
    assert parts[-1].data == {"run_id": run_id, "thread_id": tid, "status": "success"}
    values = [p.data for p in parts if p.event == "values"]
    # The first values hold the new human message on top of the thread's history; the last,
    # the reply.
    assert texts(values[0]) == ["before", "saw [] then before", "hello there"]
    assert texts(values[-1])[-1] == "saw [before] then hello there"
    tokens = [p.data for p in parts if p.event == "messages"]
    assert len(tokens) > 1, "the reply came as one piece, not token by token"
    reply = values[-1]["messages"][-1]
    assert all(chunk["id"] == reply["id"] for chunk, _ in tokens)
    assert "".join(chunk["content"] for chunk, _ in tokens) == reply["content"]
    assert all(meta["run_id"] == run_id for _, meta in tokens)
    # Every frame has an id, so a client can resume after any of them.
    assert all(p.id for p in parts)
    assert client.threads.get_state(tid)["values"] == values[-1]


def test_the_modes_agent_chat_ui_asks_for_stream_the_same_run(
    client: SyncLangGraphClient,
) -> None:
    """agent-chat-ui streams with ``custom`` among its modes (and debuggers ask for ``events``
    and ``debug``): accepted, and they send nothing of their own; the run streams what the
    modes tether serves send, to the end."""
    tid = client.threads.create()["thread_id"]
    modes: Any = ["values", "messages-tuple", "custom", "events", "debug"]
    parts = list(client.runs.stream(tid, "echo", input=human("hi"), stream_mode=modes))
    kinds = {p.event for p in parts}
    assert kinds == {"metadata", "values", "messages", "end"}, kinds
    assert parts[-1].data["status"] == "success"
    assert texts([p.data for p in parts if p.event == "values"][-1]) == ["hi", "saw [] then hi"]
    # Only modes tether has nothing for: the run still runs, and streams its end.
    quiet = list(client.runs.stream(tid, "echo", input=human("again"), stream_mode=["custom"]))
    assert [p.event for p in quiet] == ["metadata", "end"]
    assert texts(client.threads.get_state(tid)["values"])[-1] == "saw [hi] then again"


def test_the_join_stream_replays_and_resumes_after_last_event_id(
    client: SyncLangGraphClient,
) -> None:
    tid = client.threads.create()["thread_id"]
    modes: list[Any] = ["values", "updates", "messages-tuple"]
    live = list(client.runs.stream(tid, "slow", input=human("go"), stream_mode=modes))
    run_id = live[0].data["run_id"]
    replayed = list(client.runs.join_stream(tid, run_id, stream_mode=modes))
    assert [(p.id, p.event, p.data) for p in replayed] == [(p.id, p.event, p.data) for p in live]
    for cut in (1, len(live) // 2, len(live) - 2):
        resumed = list(
            client.runs.join_stream(tid, run_id, stream_mode=modes, last_event_id=live[cut].id)
        )
        # Exactly the frames after the one named: no gap, no duplicate.
        assert [p.id for p in resumed] == [p.id for p in live[cut + 1 :]]
    assert list(client.runs.join_stream(tid, run_id, last_event_id=live[-1].id)) == []


def test_a_stream_names_where_to_pick_it_up(client: SyncLangGraphClient, server: Server) -> None:
    tid = client.threads.create()["thread_id"]
    body = {"assistant_id": "echo", "input": human("hi"), "stream_mode": ["updates", "values"]}
    with server.client() as c, c.stream("POST", f"/lg/threads/{tid}/runs/stream", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("id: ")]
        run_url = r.headers["Content-Location"]
        location = r.headers["Location"]
    run_id = run_url.rsplit("/", 1)[-1]
    assert run_url == f"{server.url}/lg/threads/{tid}/runs/{run_id}"
    assert location == f"{run_url}/stream?stream_mode=updates&stream_mode=values"
    # What a client whose stream was cut off does: GET the Location, with Last-Event-ID.
    last = lines[1].removeprefix("id: ")
    with server.client() as c:
        again = c.get(location, headers={"Last-Event-ID": last})
    ids = [line for line in again.text.splitlines() if line.startswith("id: ")]
    assert ids == lines[2:]
    assert client.runs.get(tid, run_id)["status"] == "success"


def test_reject_on_a_busy_thread_is_the_sdks_conflict_and_enqueue_waits(
    client: SyncLangGraphClient,
) -> None:
    tid = client.threads.create()["thread_id"]
    slow = client.runs.create(tid, "slow", input=human("long one"))
    assert slow["status"] in ("pending", "running")
    until_status(client, tid, slow["run_id"], "running")
    with pytest.raises(ConflictError):
        client.runs.create(tid, "echo", input=human("now!"), multitask_strategy="reject")
    with pytest.raises(httpx.HTTPStatusError) as caught:  # runs.wait raises httpx's own
        client.runs.wait(tid, "echo", input=human("now!"), multitask_strategy="reject")
    assert caught.value.response.status_code == 409
    queued = client.runs.wait(tid, "echo", input=human("after"), multitask_strategy="enqueue")
    assert texts(queued)[-1] == "saw [long one] then after"
    assert client.runs.get(tid, slow["run_id"])["status"] == "success"


def test_interrupt_ends_the_run_under_way(client: SyncLangGraphClient) -> None:
    tid = client.threads.create()["thread_id"]
    slow = client.runs.create(tid, "slow", input=human("long one"))
    until_status(client, tid, slow["run_id"], "running")
    newer = client.runs.wait(tid, "echo", input=human("instead"), multitask_strategy="interrupt")
    assert texts(newer)[-1] == "saw [long one] then instead"
    assert client.runs.get(tid, slow["run_id"])["status"] == "interrupted"


def test_a_cancelled_run_ends_interrupted_not_success(client: SyncLangGraphClient) -> None:
    tid = client.threads.create()["thread_id"]
    run = client.runs.create(tid, "slow", input=human("go"))
    until_status(client, tid, run["run_id"], "running")
    client.runs.cancel(tid, run["run_id"], wait=True)
    assert client.runs.get(tid, run["run_id"])["status"] == "interrupted"
    joined = client.runs.join(tid, run["run_id"])
    assert "__error__" not in joined
    # The partial reply stays in the thread, as tether keeps it (marked incomplete).
    assert texts(joined)[0] == "go"
    assert client.threads.get(tid)["status"] == "idle"
    with pytest.raises(UnprocessableEntityError):
        client.runs.cancel(tid, run["run_id"], action="rollback")


def test_a_failed_model_is_a_run_in_error(
    client: SyncLangGraphClient, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    tid = client.threads.create(metadata={"graph_id": "upstream"})["thread_id"]
    with pytest.raises(Exception, match="model_error") as caught:
        client.runs.wait(tid, "upstream", input=human("doomed"))
    assert "upstream melted" not in str(caught.value)
    [failed] = client.runs.list(tid)
    assert failed["status"] == "error"
    assert client.threads.get(tid)["status"] == "error"
    parts = list(client.runs.join_stream(tid, failed["run_id"]))
    assert [p.event for p in parts][-2:] == ["error", "end"]
    assert parts[-1].data["status"] == "error"
    again = client.runs.wait(tid, "upstream", input=human("again"))
    # The failed turn is not part of what the model is shown next, nor of the state.
    assert texts(again) == ["again", "fine now"]


def test_a_turn_waiting_for_a_human_is_an_interrupted_run(client: SyncLangGraphClient) -> None:
    tid = client.threads.create(metadata={"graph_id": "asker"})["thread_id"]
    out = client.runs.wait(tid, "asker", input=human("pick one"))
    [asked] = out["__interrupt__"]  # type: ignore[call-overload]
    assert asked["value"]["kind"] == "question"
    assert asked["value"]["payload"]["question"] == "Which planet?"
    [run] = client.runs.list(tid)
    assert run["status"] == "interrupted"
    thread = client.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert thread["interrupts"] == {run["run_id"]: [asked]}
    state = client.threads.get_state(tid)
    assert state["interrupts"] == [asked] and state["next"] == ["tools"]
    parts = list(client.runs.join_stream(tid, run["run_id"]))
    assert parts[-1].event == "end" and parts[-1].data["status"] == "interrupted"
    assert parts[-2].data["__interrupt__"] == [asked]
    # A new run under reject is refused while the question waits, saying so.
    with pytest.raises(ConflictError) as caught:
        client.runs.create(tid, "asker", input=human("hello?"))
    assert caught.value.response.json()["code"] == "awaiting_input"


def test_a_resume_command_answers_the_interrupt_and_the_run_goes_on(
    client: SyncLangGraphClient,
) -> None:
    tid = client.threads.create()["thread_id"]
    asked = client.runs.wait(tid, "asker", input=human("pick one"))
    [interrupt] = asked["__interrupt__"]  # type: ignore[call-overload]
    [run] = client.runs.list(tid)
    done = client.runs.wait(tid, "asker", command={"resume": "Mars"})
    assert "__interrupt__" not in done
    reply = texts(done)[-1]
    assert reply.startswith("noted:") and "Mars" in reply
    # The same run went on: no second run, and it ended well.
    [after] = client.runs.list(tid)
    assert after["run_id"] == run["run_id"] and after["status"] == "success"
    kinds = [m["type"] for m in done["messages"]]  # type: ignore[call-overload]
    assert kinds == ["human", "ai", "tool", "ai"]
    assert done["messages"][1]["tool_calls"][0]["id"] == interrupt["id"]  # type: ignore[call-overload]
    with pytest.raises(ConflictError):  # nothing waits any more
        client.runs.create(tid, "asker", command={"resume": "Venus"})


def test_a_streamed_run_stops_at_an_approval_and_a_resume_streams_the_rest(
    client: SyncLangGraphClient,
) -> None:
    tid = client.threads.create()["thread_id"]
    modes: list[Any] = ["values", "updates"]
    first = list(client.runs.stream(tid, "approver", input=human("launch"), stream_mode=modes))
    assert first[-1].event == "end" and first[-1].data["status"] == "interrupted"
    [interrupt] = first[-2].data["__interrupt__"]
    assert interrupt["value"]["kind"] == "approval"
    assert interrupt["value"]["payload"]["tool"] == "launch"
    rest = list(
        client.runs.stream(tid, "approver", command={"resume": "approve"}, stream_mode=modes)
    )
    assert rest[0].event == "metadata" and rest[0].data["run_id"] == first[0].data["run_id"]
    assert rest[-1].event == "end" and rest[-1].data["status"] == "success"
    assert not {p.id for p in rest[1:]} & {p.id for p in first}, "frames sent twice"
    tools = [p.data["tools"] for p in rest if p.event == "updates" and "tools" in p.data]
    assert tools[0]["messages"][0]["content"] == "launched rocket"
    assert texts(rest[-2].data)[-1] == "tool said: launched rocket"


def test_threads_are_the_callers_own(make_server: ServerFactory) -> None:
    srv = make_server()
    alice_key = create_key(srv.data_dir, "alice")
    bob_key = create_key(srv.data_dir, "bob")
    with sdk(srv, alice_key.secret) as alice, sdk(srv, bob_key.secret) as bob:
        _apart(srv, alice, bob)


def _apart(srv: Server, alice: SyncLangGraphClient, bob: SyncLangGraphClient) -> None:
    for _ in range(200):  # the server caches "are there keys" for a second
        try:
            alice.assistants.search()
            break
        except AuthenticationError:
            time.sleep(0.02)
    mine = [alice.threads.create(metadata={"n": n, "who": "alice"})["thread_id"] for n in range(3)]
    theirs = bob.threads.create(metadata={"who": "bob"})["thread_id"]
    alice.runs.wait(mine[0], "echo", input=human("alice here"))
    listed = [t["thread_id"] for t in alice.threads.search(limit=100)]
    assert sorted(listed) == sorted(mine)
    assert [t["thread_id"] for t in bob.threads.search(limit=100)] == [theirs]
    # Newest first; metadata filters; limit and offset page.
    assert listed == mine[::-1]
    assert [t["thread_id"] for t in alice.threads.search(metadata={"n": 1})] == [mine[1]]
    page = alice.threads.search(limit=1, offset=1)
    assert [t["thread_id"] for t in page] == [mine[1]]
    assert alice.threads.count(metadata={"who": "alice"}) == 3
    # Bob naming Alice's thread: the 404 of a thread that does not exist, in LangGraph's form.
    for attempt in (
        lambda: bob.threads.get(mine[0]),
        lambda: bob.threads.get_state(mine[0]),
        lambda: bob.runs.create(mine[0], "echo", input=human("bob here")),
        lambda: bob.runs.list(mine[0]),
        lambda: bob.threads.delete(mine[0]),
        lambda: bob.threads.get("never-made"),
    ):
        with pytest.raises(NotFoundError) as caught:
            attempt()
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "thread_not_found"
    assert texts(alice.threads.get_state(mine[0])["values"]) == [
        "alice here",
        "saw [] then alice here",
    ]
    # Once keys exist, the placeholder local mode took is refused like any unknown key.
    with sdk(srv) as nobody, pytest.raises(AuthenticationError):
        nobody.threads.search()


def test_creating_a_thread_that_exists(client: SyncLangGraphClient) -> None:
    tid = "lg-existing-1"
    assert client.threads.create(thread_id=tid)["thread_id"] == tid
    with pytest.raises(ConflictError):
        client.threads.create(thread_id=tid)
    assert client.threads.create(thread_id=tid, if_exists="do_nothing")["thread_id"] == tid
    client.threads.delete(tid)
    with pytest.raises(NotFoundError):
        client.threads.get(tid)
    # A run may make the thread it names.
    made = client.runs.wait("lg-made-by-run", "echo", input=human("hi"), if_not_exists="create")
    assert texts(made) == ["hi", "saw [] then hi"]
    with pytest.raises(NotFoundError):
        client.runs.create("lg-never-made", "echo", input=human("hi"))


def test_a_stateless_run_leaves_no_thread(client: SyncLangGraphClient) -> None:
    before = {t["thread_id"] for t in client.threads.search(limit=1000)}
    out = client.runs.wait(None, "echo", input=human("one-off"))
    assert texts(out) == ["one-off", "saw [] then one-off"]
    parts = list(client.runs.stream(None, "echo", input=human("streamed one-off")))
    assert texts(parts[-2].data)[-1] == "saw [] then streamed one-off"
    after: set[str] = set()
    for _ in range(500):
        after = {t["thread_id"] for t in client.threads.search(limit=1000)}
        if after == before:
            break
        time.sleep(0.01)
    assert after == before


def test_a_search_while_threads_are_deleted_never_fails(server: Server) -> None:
    """Threads deleted between a search's listing and its read of them are left out; the
    search is never a 404 (it was, when a stateless run's thread went mid-search)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        with sdk(server) as c:
            while not stop.is_set():
                tid = c.threads.create(metadata={"churn": True})["thread_id"]
                c.threads.delete(tid)

    def search() -> int:
        done = 0
        with sdk(server) as c:
            for _ in range(150):
                try:
                    c.threads.search(metadata={"churn": True}, limit=1000)
                    c.threads.search(metadata={"churn": True}, status="idle", limit=1000)
                except Exception as e:  # every failure is the finding
                    errors.append(e)
                done += 1
        return done

    churners = [threading.Thread(target=churn) for _ in range(3)]
    for t in churners:
        t.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            assert sum(pool.map(lambda _: search(), range(2))) == 300
    finally:
        stop.set()
        for t in churners:
            t.join()
    assert errors == []


def test_bad_input_is_refused_in_langgraphs_form(client: SyncLangGraphClient) -> None:
    tid = client.threads.create()["thread_id"]
    for body in (
        {"input": {"messages": [{"role": "assistant", "content": "no human"}]}},
        {"input": "hello"},
        {"input": human("x"), "interrupt_before": ["tools"]},
        {"input": human("x"), "stream_mode": "nonsense"},
        {"input": human("x"), "multitask_strategy": "sometimes"},
    ):
        with pytest.raises(UnprocessableEntityError) as caught:
            client.runs.create(tid, "echo", **body)
        assert isinstance(caught.value.body, dict) and caught.value.body["detail"]
    with pytest.raises(NotFoundError):
        client.runs.create(tid, "nobody", input=human("x"))
    assert client.runs.list(tid) == [] and client.threads.get_state(tid)["values"] == {
        "messages": []
    }


def test_the_face_can_be_switched_off(make_server: ServerFactory) -> None:
    srv = make_server(env={"TETHER_FACES_LANGGRAPH": "off"})
    with srv.client() as c:
        assert c.get("/lg/info").status_code == 404
        assert c.get("/v1/agents").status_code == 200
