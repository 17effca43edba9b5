"""The AG-UI face against a real ``tether serve``: every SSE ``data:`` line is parsed with
``ag-ui-protocol``'s own event models, so what a CopilotKit client reads is checked as it reads
it."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Event,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from pydantic import TypeAdapter

from tests.server.cli_keys import assert_problem, create_key
from tests.server.conftest import Server, ServerFactory
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

EVENT: TypeAdapter[BaseEvent] = TypeAdapter(Event)


def body(thread: str, *texts: str, resume: list[dict[str, Any]] | None = None) -> str:
    """A RunAgentInput as an AG-UI client sends it: the whole conversation, a fresh run id."""
    run = RunAgentInput(
        thread_id=thread,
        run_id=f"run-{uuid.uuid4()}",
        messages=[UserMessage(id=f"m{n}", content=t) for n, t in enumerate(texts)],
        resume=[ResumeEntry.model_validate(r) for r in resume] if resume else None,
    )
    return run.model_dump_json(by_alias=True)


def run(
    server: Server, agent: str, payload: str, key: str | None = None
) -> tuple[str, list[BaseEvent]]:
    """POST the run and parse every event of the stream; (the run id sent, the events)."""
    sent = json.loads(payload)["runId"]
    found: list[BaseEvent] = []
    with (
        server.client(key) as c,
        c.stream("POST", f"/agui/{agent}", content=payload, headers=_JSON) as r,
    ):
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line or line.startswith(":"):
                continue  # a comment: the stream's ping while nothing happens
            assert line.startswith("data: "), line
            found.append(EVENT.validate_json(line.removeprefix("data: ")))
    return sent, found


_JSON = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def kinds(found: list[BaseEvent]) -> list[str]:
    return [e.type.value for e in found]


def text_of(found: list[BaseEvent]) -> str:
    return "".join(e.delta for e in found if isinstance(e, TextMessageContentEvent))


def assert_run_frame(found: list[BaseEvent], thread: str, run_id: str) -> None:
    """RUN_STARTED first, exactly one terminal event last, text messages well nested."""
    first, last = found[0], found[-1]
    assert isinstance(first, RunStartedEvent)
    assert (first.thread_id, first.run_id, first.protocol_version) == (thread, run_id, "1.0")
    assert isinstance(last, RunFinishedEvent | RunErrorEvent)
    terminal = [e for e in found if isinstance(e, RunFinishedEvent | RunErrorEvent)]
    assert terminal == [last]
    if isinstance(last, RunFinishedEvent):
        assert (last.thread_id, last.run_id) == (thread, run_id)
    open_id: str | None = None
    for e in found:
        if isinstance(e, TextMessageStartEvent):
            assert open_id is None and e.role == "assistant"
            open_id = e.message_id
        elif isinstance(e, TextMessageContentEvent):
            assert e.message_id == open_id
        elif isinstance(e, TextMessageEndEvent):
            assert e.message_id == open_id
            open_id = None
        elif isinstance(e, ToolCallStartEvent | RunFinishedEvent | RunErrorEvent):
            assert open_id is None, "a text message left open"


def new_thread() -> str:
    return str(uuid.uuid4())  # AG-UI clients mint their own thread ids


def test_a_turn_is_a_well_formed_event_sequence(server: Server) -> None:
    thread = new_thread()
    run_id, found = run(server, "echo", body(thread, "hi"))
    assert_run_frame(found, thread, run_id)
    assert kinds(found)[:3] == ["RUN_STARTED", "CUSTOM", "TEXT_MESSAGE_START"]
    assert kinds(found)[-2:] == ["TEXT_MESSAGE_END", "RUN_FINISHED"]
    assert set(kinds(found)[3:-2]) == {"TEXT_MESSAGE_CONTENT"}
    assert text_of(found) == "saw [] then hi"
    finished = found[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert isinstance(finished.outcome, RunFinishedSuccessOutcome)
    assert isinstance(finished.result, dict) and finished.result["reply"] == "saw [] then hi"
    named = found[1]
    assert isinstance(named, CustomEvent) and named.name == "tether.turn"
    assert named.value["turn_id"] == finished.result["turn_id"]
    # The thread is a tether session of the caller's, made on first use.
    with server.client() as c:
        assert c.get(f"/v1/sessions/{thread}").status_code == 200


def test_a_second_run_on_the_thread_continues_it(server: Server) -> None:
    thread = new_thread()
    _, first = run(server, "echo", body(thread, "one"))
    assert text_of(first) == "saw [] then one"
    # The client resends the conversation: only its last user message is new.
    run_id, second = run(server, "echo", body(thread, "one", "two"))
    assert_run_frame(second, thread, run_id)
    assert text_of(second) == "saw [one] then two"
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{thread}/turns").json()["data"]
    assert [t["input"] for t in turns] == ["one", "two"]


def test_a_messages_text_parts_are_one_line_each(server: Server) -> None:
    thread = new_thread()
    payload = json.loads(body(thread, "x"))
    payload["messages"][0]["content"] = [
        {"type": "text", "text": "two"},
        {"type": "text", "text": "parts"},
    ]
    _, found = run(server, "echo", json.dumps(payload))
    assert text_of(found) == "saw [] then two\nparts"


def test_a_run_sent_again_is_the_same_turn_and_one_ending_with_the_reply_is_refused(
    server: Server,
) -> None:
    # AG-UI clients send the whole conversation with every run. Before, a retried run, or one
    # whose conversation ended with the agent's reply (nothing new said), had the last user
    # message answered again: a second turn, and the history held the message twice.
    thread = new_thread()
    once = RunAgentInput(
        thread_id=thread,
        run_id="run-once",
        messages=[UserMessage(id="u1", content="hello")],
    ).model_dump_json(by_alias=True)
    _, first = run(server, "echo", once)
    _, again = run(server, "echo", once)
    assert kinds(again) == kinds(first) and text_of(again) == text_of(first) == "saw [] then hello"
    assert again[-1] == first[-1]  # RUN_FINISHED: the same turn, the same reply
    answered = json.loads(once) | {
        "runId": "run-next",
        "messages": [
            {"id": "u1", "role": "user", "content": "hello"},
            {"id": "a1", "role": "assistant", "content": "saw [] then hello"},
        ],
    }
    with server.client() as c:
        r = c.post("/agui/echo", content=json.dumps(answered), headers=_JSON)
        assert_problem(r, 400)
        assert "nothing new to answer" in r.json()["detail"]
        turns = c.get(f"/v1/sessions/{thread}/turns").json()["data"]
        items = c.get(f"/v1/sessions/{thread}/items").json()["data"]
    assert [t["input"] for t in turns] == ["hello"]
    assert [i["kind"] for i in items] == ["user", "assistant"]
    # The same ids with another text are another message, not a retry: it is answered.
    other = json.loads(once) | {"messages": [{"id": "u1", "role": "user", "content": "bye"}]}
    _, third = run(server, "echo", json.dumps(other))
    assert text_of(third) == "saw [hello] then bye"


def test_a_failed_model_is_a_run_error(server: Server, fake_openai: FakeOpenAIServer) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    thread = new_thread()
    run_id, found = run(server, "upstream", body(thread, "doomed"))
    assert_run_frame(found, thread, run_id)
    error = found[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "model_error"
    assert "upstream melted" not in error.message
    assert not any(isinstance(e, RunFinishedEvent) for e in found)
    _, again = run(server, "upstream", body(thread, "again"))
    assert text_of(again) == "fine now" and isinstance(again[-1], RunFinishedEvent)


def test_the_agents_own_tools_are_tool_call_events(server: Server) -> None:
    thread = new_thread()
    run_id, found = run(server, "shouter", body(thread, "hey"))
    assert_run_frame(found, thread, run_id)
    calls = [e for e in found if isinstance(e, ToolCallStartEvent | ToolCallArgsEvent)]
    start, args = calls
    assert isinstance(start, ToolCallStartEvent) and start.tool_call_name == "shout"
    assert isinstance(args, ToolCallArgsEvent) and json.loads(args.delta) == {"text": "hey"}
    (end,) = [e for e in found if isinstance(e, ToolCallEndEvent)]
    (result,) = [e for e in found if isinstance(e, ToolCallResultEvent)]
    assert start.tool_call_id == args.tool_call_id == end.tool_call_id == result.tool_call_id
    assert result.content == "HEY"
    order = kinds(found)
    assert order.index("TOOL_CALL_START") < order.index("TOOL_CALL_ARGS")
    assert order.index("TOOL_CALL_END") < order.index("TOOL_CALL_RESULT")
    assert order.index("TOOL_CALL_RESULT") < order.index("TEXT_MESSAGE_START")
    assert text_of(found) == "it says HEY" and order[-1] == "RUN_FINISHED"


def test_a_question_is_an_interrupt_answered_by_a_resume(server: Server) -> None:
    thread = new_thread()
    run_id, asked = run(server, "asker", body(thread, "hello"))
    assert_run_frame(asked, thread, run_id)
    custom, finished = asked[-2:]
    assert isinstance(custom, CustomEvent) and custom.name == "tether.awaiting_input"
    assert isinstance(finished, RunFinishedEvent)
    assert isinstance(finished.outcome, RunFinishedInterruptOutcome)
    (interrupt,) = finished.outcome.interrupts
    assert interrupt.reason == "question" and interrupt.message == "What is your name?"
    assert interrupt.response_schema is not None
    assert interrupt.response_schema["required"] == ["answer"]
    # A new message meanwhile is refused, not queued behind the question.
    _, refused = run(server, "asker", body(thread, "hello", "anyone?"))
    assert isinstance(refused[-1], RunErrorEvent) and refused[-1].code == "awaiting_input"
    # The follow-up run answers it and streams the rest of the same turn.
    answer = [{"interruptId": interrupt.id, "status": "resolved", "payload": {"answer": "Ada"}}]
    run_id, resumed = run(server, "asker", body(thread, "hello", resume=answer))
    assert_run_frame(resumed, thread, run_id)
    assert text_of(resumed) == "noted: The user answered: Ada"
    assert isinstance(resumed[-1], RunFinishedEvent)
    assert isinstance(resumed[-1].outcome, RunFinishedSuccessOutcome)
    assert not any(isinstance(e, ToolCallStartEvent) for e in resumed), "replayed run 1"
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{thread}/turns").json()["data"]
    assert [(t["input"], t["status"]) for t in turns] == [("hello", "completed")]


def test_an_approval_is_an_interrupt_on_its_tool_call(server: Server) -> None:
    thread = new_thread()
    _, asked = run(server, "approver", body(thread, "go"))
    (start,) = [e for e in asked if isinstance(e, ToolCallStartEvent)]
    finished = asked[-1]
    assert isinstance(finished, RunFinishedEvent)
    assert isinstance(finished.outcome, RunFinishedInterruptOutcome)
    (interrupt,) = finished.outcome.interrupts
    assert interrupt.reason == "tool_approval" and interrupt.tool_call_id == start.tool_call_id
    # An unknown interrupt id is refused and decides nothing.
    wrong = [{"interruptId": "call_nope", "status": "resolved", "payload": True}]
    _, refused = run(server, "approver", body(thread, resume=wrong))
    assert isinstance(refused[-1], RunErrorEvent) and refused[-1].code == "interrupt_not_found"
    approve = [{"interruptId": interrupt.id, "status": "resolved", "payload": True}]
    _, resumed = run(server, "approver", body(thread, resume=approve))
    (result,) = [e for e in resumed if isinstance(e, ToolCallResultEvent)]
    assert result.tool_call_id == start.tool_call_id and result.content == "launched rocket"
    assert text_of(resumed) == "tool said: launched rocket"
    assert isinstance(resumed[-1], RunFinishedEvent)


def test_a_stop_button_cancels_the_run_through_the_turn_it_names(server: Server) -> None:
    thread = new_thread()
    payload = body(thread, "go")
    found: list[BaseEvent] = []
    with (
        server.client() as c,
        c.stream("POST", "/agui/slow", content=payload, headers=_JSON) as r,
    ):
        for line in r.iter_lines():
            if not line:
                continue
            event = EVENT.validate_json(line.removeprefix("data: "))
            found.append(event)
            if isinstance(event, CustomEvent) and event.name == "tether.turn":
                # What a Stop button does: the run names its turn and where to cancel it.
                assert event.value["session_id"] == thread
                with server.client() as stop:
                    assert stop.post(event.value["cancel"]).json()["status"] == "cancelled"
    error = found[-1]
    assert isinstance(error, RunErrorEvent) and error.code == "cancelled"
    # Partial text, if any came before the cancel, is closed before the error.
    assert_run_frame(found, thread, json.loads(payload)["runId"])


def test_a_client_that_goes_away_leaves_the_turn_running(server: Server) -> None:
    thread = new_thread()
    with (
        server.client() as c,
        c.stream("POST", "/agui/slow", content=body(thread, "go"), headers=_JSON) as r,
    ):
        for line in r.iter_lines():
            if line and isinstance(EVENT.validate_json(line[6:]), TextMessageContentEvent):
                break  # gone mid-reply
    with server.client() as c:
        for _ in range(1000):
            (turn,) = c.get(f"/v1/sessions/{thread}/turns").json()["data"]
            if turn["status"] not in ("queued", "running"):
                break
            time.sleep(0.01)
    assert turn["status"] == "completed" and turn["output"].endswith("w39")


def test_threads_are_the_callers_own_and_keys_are_required(make_server: ServerFactory) -> None:
    srv = make_server()
    alice = create_key(srv.data_dir, "alice")
    bob = create_key(srv.data_dir, "bob")
    with srv.client() as c:
        for _ in range(300):  # the server caches "do keys exist" for a second
            r = c.post("/agui/echo", content=body("t", "hi"), headers=_JSON)
            if r.status_code == 401:
                break
            time.sleep(0.01)
        assert_problem(r, 401)
    _, mine = run(srv, "echo", body("shared-thread", "alice here"), alice.secret)
    assert text_of(mine) == "saw [] then alice here"
    # Bob naming the same thread id gets a thread of his own, never Alice's conversation.
    _, theirs = run(srv, "echo", body("shared-thread", "bob here"), bob.secret)
    assert text_of(theirs) == "saw [] then bob here"
    _, again = run(srv, "echo", body("shared-thread", "alice here", "again"), alice.secret)
    assert text_of(again) == "saw [alice here] then again"


def test_bad_requests_are_refused_before_any_run(server: Server) -> None:
    with server.client() as c:
        r = c.post("/agui/nobody", content=body(new_thread(), "hi"), headers=_JSON)
        assert_problem(r, 404)
        assert_problem(c.post("/agui/echo", content=b"{not json", headers=_JSON), 400)
        no_user = json.dumps({"threadId": "t1", "runId": "r1", "messages": []})
        assert_problem(c.post("/agui/echo", content=no_user, headers=_JSON), 400)
        bad_thread = json.dumps(
            {"threadId": "not a thread!", "runId": "r", "messages": [_user("hi")]}
        )
        assert_problem(c.post("/agui/echo", content=bad_thread, headers=_JSON), 400)
        # A frontend's own tools would never be called: refused, not silently dropped.
        thread = new_thread()
        tool = {"name": "setTheme", "description": "Set the theme", "parameters": {}}
        frontend = json.dumps(
            {"threadId": thread, "runId": "r", "messages": [_user("hi")], "tools": [tool]}
        )
        r = c.post("/agui/echo", content=frontend, headers=_JSON)
        assert_problem(r, 400)
        assert "setTheme" in r.json()["detail"]
        assert c.get(f"/v1/sessions/{thread}").status_code == 404  # nothing was stored


def _user(text: str) -> dict[str, str]:
    return {"id": "m1", "role": "user", "content": text}


@pytest.mark.parametrize("value", ["off"])
def test_the_face_can_be_switched_off(make_server: ServerFactory, value: str) -> None:
    srv = make_server(env={"TETHER_FACES_AGUI": value})
    with srv.client() as c:
        assert (
            c.post("/agui/echo", content=body(new_thread(), "hi"), headers=_JSON).status_code == 404
        )
        assert c.get("/v1/agents").status_code == 200
