"""The OpenAI face's streaming chat completions and its Responses API, driven by the real
``openai`` SDK against a real server and the fake OpenAI model."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseErrorEvent,
    ResponseFailedEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)

from tests.server.conftest import Server, ServerFactory
from tests.server.test_face_openai import SESSION, begin, sdk, users
from tether.testing.fake_openai import FakeError, FakeOpenAIServer


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with sdk(server) as c:
        yield c


def _users_and_assistants(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (m["role"], m["content"])
        for m in request["messages"]
        if m["role"] in ("user", "assistant") and isinstance(m.get("content"), str)
    ]


def test_a_resent_history_reaches_the_model_once(
    client: openai.OpenAI, server: Server, fake_openai: FakeOpenAIServer
) -> None:
    sid = begin(server, "once-1", "upstream")
    fake_openai.script("first answer", "second answer")
    headers = {SESSION: sid}
    first = client.chat.completions.create(
        model="upstream", messages=[{"role": "user", "content": "hello"}], extra_headers=headers
    )
    assert first.choices[0].message.content == "first answer"
    fake_openai.reset()
    # The client resends the whole conversation, as chat-completions clients do.
    client.chat.completions.create(
        model="upstream",
        messages=[
            {"role": "system", "content": "a system prompt the agent's template overrides"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "and again"},
        ],
        extra_headers=headers,
    )
    (seen,) = fake_openai.chat_requests
    assert _users_and_assistants(seen) == [
        ("user", "hello"),
        ("assistant", "first answer"),
        ("user", "and again"),
    ]


def test_a_one_off_call_gives_the_model_the_history_it_was_sent(
    client: openai.OpenAI, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.reset()
    fake_openai.script("fine")
    client.chat.completions.create(
        model="upstream",
        messages=[
            {"role": "user", "content": "my name is Ada"},
            {"role": "assistant", "content": "hello Ada"},
            {"role": "user", "content": "what is my name?"},
        ],
    )
    (seen,) = fake_openai.chat_requests
    said = _users_and_assistants(seen)
    assert len(said) == 1 and said[0][0] == "user"
    text = said[0][1]
    assert "user: my name is Ada" in text and "assistant: hello Ada" in text
    assert text.endswith("what is my name?")


def test_streaming_yields_deltas_then_a_usage_chunk(
    client: openai.OpenAI, server: Server, fake_openai: FakeOpenAIServer
) -> None:
    sid = begin(server, "stream-1", "upstream")
    fake_openai.script("alpha beta gamma delta")
    # The upstream writes its words apart, as a model does: what arrives in one read is one
    # delta, so words written at once could come through as one.
    fake_openai.chunk_delay_ms = 20
    try:
        stream = client.chat.completions.create(
            model="upstream",
            messages=[{"role": "user", "content": "go"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={SESSION: sid},
        )
        chunks = list(stream)
    finally:
        fake_openai.chunk_delay_ms = 0
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == "alpha beta gamma delta"
    assert len([p for p in pieces if p]) > 1, "the text came in one piece: not streamed"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and all(f is None for f in finish[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1
    # The streamed turn is in the session's history like any other.
    reply = client.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "next"}], extra_headers={SESSION: sid}
    )
    assert reply.choices[0].message.content == "saw [go] then next"


def test_a_stream_whose_model_fails_ends_in_an_error(
    client: openai.OpenAI, server: Server, fake_openai: FakeOpenAIServer
) -> None:
    sid = begin(server, "stream-fail", "upstream")
    fake_openai.script(FakeError(500, "upstream melted", times=2))
    stream = client.chat.completions.create(
        model="upstream",
        messages=[{"role": "user", "content": "go"}],
        stream=True,
        extra_headers={SESSION: sid},
    )
    seen: list[str] = []
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            seen.extend(c.finish_reason or "" for c in chunk.choices)
    assert "stop" not in seen
    assert "failed" in caught.value.message


def test_responses_continue_by_previous_response_id_and_by_conversation(
    client: openai.OpenAI,
) -> None:
    first = client.responses.create(model="echo", input="one")
    assert first.status == "completed" and first.output_text == "saw [] then one"
    assert first.conversation is not None
    second = client.responses.create(model="echo", input="two", previous_response_id=first.id)
    assert second.output_text == "saw [one] then two"
    assert second.previous_response_id == first.id
    third = client.responses.create(
        model="echo",
        input=[{"role": "user", "content": "three"}],
        conversation=first.conversation.id,
    )
    assert third.output_text == "saw [one, two] then three"
    again = client.responses.retrieve(second.id)
    assert again.status == "completed" and again.output_text == second.output_text
    # tether's conversations do not branch: continuing an answer that has been followed up is
    # refused, not silently continued from the latest.
    with pytest.raises(openai.ConflictError) as caught:
        client.responses.create(model="echo", input="fork", previous_response_id=first.id)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "conversation_moved_on"
    # Every 409 says so: the SDK would otherwise retry it, and be refused again.
    assert caught.value.response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize("background", [False, True])
def test_one_response_continued_at_once_goes_on_once(
    client: openai.OpenAI, server: Server, background: bool
) -> None:
    """Eight requests continue one response at the same moment: the first goes on, the rest
    are refused (409 conversation_moved_on) and nothing of theirs runs; the check and the
    submission used to be two steps, and three or four of them ran, one after the other."""
    first = client.responses.create(model="echo", input="root")
    barrier = threading.Barrier(8)

    def go_on(n: int) -> str:
        barrier.wait()
        try:
            r = client.responses.create(
                model="echo",
                input=f"branch {n}",
                previous_response_id=first.id,
                background=background,
            )
        except openai.ConflictError as exc:
            assert isinstance(exc.body, dict)
            return str(exc.body["code"])
        return r.id

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(go_on, range(8)))
    won = [a for a in answers if a != "conversation_moved_on"]
    assert len(won) == 1, answers
    winner = client.responses.retrieve(won[0])
    deadline = time.monotonic() + 10
    while winner.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.05)
        winner = client.responses.retrieve(won[0])
    assert winner.status == "completed"
    assert first.conversation is not None
    sid = first.conversation.id
    turns = httpx.get(f"{server.url}/v1/sessions/{sid}/turns").json()["data"]
    ran = [t["input"] for t in turns if t["status"] == "completed"]
    assert ran == ["root", winner.output_text.rsplit(" then ", 1)[1]]
    # The refused ones were withdrawn before they ran (or never made).
    assert all(t["status"] == "cancelled" for t in turns if t["status"] != "completed")


def test_a_continuation_sent_again_gets_the_same_response(client: openai.OpenAI) -> None:
    """The same message continuing the same response again (a retry, with its own key or
    none) is the response it made, not a conflict with itself; another message is a 409."""
    first = client.responses.create(model="echo", input="root")
    second = client.responses.create(
        model="echo",
        input="on",
        previous_response_id=first.id,
        extra_headers={"Idempotency-Key": "cont-1"},
    )
    for headers in ({"Idempotency-Key": "cont-1"}, {"Idempotency-Key": "cont-2"}, None):
        again = client.responses.create(
            model="echo", input="on", previous_response_id=first.id, extra_headers=headers
        )
        assert (again.id, again.output_text) == (second.id, "saw [root] then on")
    with pytest.raises(openai.ConflictError) as caught:
        client.responses.create(model="echo", input="other", previous_response_id=first.id)
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "conversation_moved_on"
    third = client.responses.create(model="echo", input="then", previous_response_id=second.id)
    assert third.output_text == "saw [root, on] then then"


def test_a_streamed_response_numbers_its_events(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="slow", input="go", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) > 1
    done = next(e for e in events if isinstance(e, ResponseTextDoneEvent))
    assert isinstance(events[-1], ResponseCompletedEvent)
    final = events[-1].response
    assert "".join(deltas) == done.text == final.output_text
    assert final.status == "completed" and final.usage is not None


def test_a_response_is_streamed_again_and_resumed_by_sequence_number(
    client: openai.OpenAI, server: Server
) -> None:
    live = list(client.responses.create(model="slow", input="go", stream=True))
    rid = live[0].response.id  # type: ignore[union-attr]
    # Read back later (any process): the same events, numbered the same, to the same end.
    again = list(client.responses.retrieve(rid, stream=True))
    assert [(e.type, e.sequence_number) for e in again] == [
        (e.type, e.sequence_number) for e in live
    ]
    assert [getattr(e, "delta", None) for e in again] == [getattr(e, "delta", None) for e in live]
    # As its request took it, live and read again alike.
    assert again[0].response.status == live[0].response.status == "queued"  # type: ignore[union-attr]
    assert isinstance(again[-1], ResponseCompletedEvent)
    assert again[-1].response.output_text == "".join(
        e.delta for e in live if isinstance(e, ResponseTextDeltaEvent)
    )
    # A dropped stream resumes after the last event it read.
    cut = len(live) // 2
    resumed = list(client.responses.retrieve(rid, stream=True, starting_after=cut))
    assert [e.sequence_number for e in resumed] == list(range(cut + 1, len(live)))
    # Read back, a response does not claim how it was asked for.
    assert client.responses.retrieve(rid).background is None
    with server.client() as c:
        r = c.get(f"/v1/responses/{rid}", params={"stream": "true", "starting_after": "-1"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "starting_after"
        r = c.get(f"/v1/responses/{rid}", params={"stream": "maybe"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


def test_a_response_that_waited_for_a_human_is_resumed_after_the_decision(
    client: openai.OpenAI, server: Server
) -> None:
    # Before, a stream read again stopped at the old wait (an error, though the turn had gone
    # on), and one resumed after the live stream's error missed the event numbered in its
    # place.
    live = list(client.responses.create(model="approver", input="launch it", stream=True))
    assert isinstance(live[-1], ResponseErrorEvent) and live[-1].code == "awaiting_input"
    rid = live[0].response.id  # type: ignore[union-attr]
    _approve_all(server, rid)
    cut = live[-1].sequence_number
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=cut))
    assert rest[0].sequence_number == cut + 1 and rest[0].type == "response.output_item.added"
    assert isinstance(rest[-1], ResponseCompletedEvent)
    deltas = [e.delta for e in rest if isinstance(e, ResponseTextDeltaEvent)]
    assert "".join(deltas) == rest[-1].response.output_text == "tool said: launched rocket"
    # Read again from the start: the same numbers as live up to the wait, then the rest.
    whole = list(client.responses.retrieve(rid, stream=True))
    assert [(e.type, e.sequence_number) for e in whole[: len(live) - 1]] == [
        (e.type, e.sequence_number) for e in live[:-1]
    ]
    assert [(e.type, e.sequence_number) for e in whole[len(live) - 1 :]] == [
        (e.type, e.sequence_number) for e in rest
    ]


def test_a_response_that_waits_twice_is_resumed_past_each_wait(
    client: openai.OpenAI, server: Server
) -> None:
    # A stream resumed after the first wait must not stop at it while the turn waits again.
    live = list(client.responses.create(model="approver", input="launch twice", stream=True))
    rid = live[0].response.id  # type: ignore[union-attr]
    cut = live[-1].sequence_number
    _approve_all(server, rid)
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=cut))
    assert rest[0].sequence_number == cut + 1
    assert isinstance(rest[-1], ResponseErrorEvent) and rest[-1].code == "awaiting_input"
    _approve_all(server, rid)
    again = rest[-1].sequence_number
    final = list(client.responses.retrieve(rid, stream=True, starting_after=again))
    assert isinstance(final[-1], ResponseCompletedEvent)
    assert final[-1].response.output_text == "tool said: launched probe"


def _approve_all(server: Server, rid: str) -> None:
    """Approve what the response's turn waits for, through tether's decisions API."""
    session_id = rid.partition(".")[2]
    with server.client() as c:
        url = f"/v1/sessions/{session_id}/decisions?status=pending"
        for pending in c.get(url).json()["decisions"]:
            r = c.post(
                f"/v1/sessions/{session_id}/turns/{pending['turn_id']}/decisions",
                json={"call_id": pending["call_id"], "decision": "approve"},
            )
            assert r.status_code == 200, r.text


def test_a_background_response_is_watched_as_it_runs(client: openai.OpenAI) -> None:
    queued = client.responses.create(model="slow", input="go", background=True)
    watched = list(client.responses.retrieve(queued.id, stream=True))
    assert [e.sequence_number for e in watched] == list(range(len(watched)))
    assert [e.type for e in watched][:2] == ["response.created", "response.in_progress"]
    deltas = [e.delta for e in watched if isinstance(e, ResponseTextDeltaEvent)]
    assert len(deltas) > 1
    assert isinstance(watched[-1], ResponseCompletedEvent)
    assert watched[-1].response.output_text == "".join(deltas)
    assert client.responses.retrieve(queued.id).status == "completed"


def test_a_failed_response_is_an_error_and_its_stream_says_failed(
    client: openai.OpenAI, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeError(500, "down", times=2))
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(model="upstream", input="doomed")
    assert caught.value.status_code == 502
    fake_openai.script(FakeError(500, "down", times=2))
    events = list(client.responses.create(model="upstream", input="doomed", stream=True))
    assert isinstance(events[-1], ResponseFailedEvent)
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert not any(e.type == "response.completed" for e in events)


def test_a_background_response_can_be_cancelled(client: openai.OpenAI) -> None:
    queued = client.responses.create(model="slow", input="go", background=True)
    # Answered as it was taken, as OpenAI answers (the turn may have started already).
    assert queued.status == "queued" and queued.background
    for _ in range(500):
        if client.responses.retrieve(queued.id).status == "in_progress":
            break
        time.sleep(0.01)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(queued.id).status == "cancelled"


def test_another_users_responses_are_not_found(make_server: ServerFactory) -> None:
    srv = make_server()
    alice, bob = users(srv, "alice", "bob")
    with sdk(srv, alice.secret) as a, sdk(srv, bob.secret) as b:
        mine = a.responses.create(model="echo", input="secret plans")
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.create(model="echo", input="peek", previous_response_id=mine.id)
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "previous_response_not_found"
        assert mine.conversation is not None
        with pytest.raises(openai.NotFoundError) as caught:
            b.responses.create(model="echo", input="peek", conversation=mine.conversation.id)
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "conversation_not_found"
        with pytest.raises(openai.NotFoundError):
            b.responses.cancel(mine.id)
        with pytest.raises(openai.NotFoundError):
            b.responses.retrieve("resp_t_AAAAAAAAAAAAAAAA.nothing")
        # Alice's conversation is untouched by Bob's attempts.
        on = a.responses.create(model="echo", input="more", previous_response_id=mine.id)
        assert on.output_text == "saw [secret plans] then more"


def test_a_streamed_turn_that_asks_a_human_ends_in_an_error_naming_it(
    client: openai.OpenAI, server: Server
) -> None:
    sid = begin(server, "stream-ask", "asker")
    stream = client.chat.completions.create(
        model="asker",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        extra_headers={SESSION: sid},
    )
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "awaiting_input"
    assert "decide" in caught.value.message
    events = list(client.responses.create(model="asker", input="hi", stream=True))
    assert isinstance(events[-1], ResponseErrorEvent) and events[-1].code == "awaiting_input"


def test_the_agents_own_tools_run_inside_tether_and_are_not_sent_to_the_client(
    client: openai.OpenAI,
) -> None:
    reply = client.chat.completions.create(
        model="shouter", messages=[{"role": "user", "content": "hey"}]
    )
    message = reply.choices[0].message
    assert message.content == "it says HEY" and not message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(
            model="shouter", messages=[{"role": "user", "content": "hey"}], stream=True
        )
    )
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ("it says HEY")
    response = client.responses.create(model="shouter", input="hey")
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == "it says HEY"


def test_a_message_behind_a_human_decision_is_withdrawn_at_every_openai_door(
    client: openai.OpenAI, server: Server
) -> None:
    """While a session waits for a decision, a new message would only queue behind it: it is
    withdrawn (nothing of it runs, ever) and refused 409 awaiting_input naming the turn that
    waits, whether asked for a plain answer or a stream. It used to be refused naming its own
    queued turn (which waits for nothing), stay queued and run after the decision — answered
    after the client was told it failed; and a stream hung until the decision or its
    deadline."""
    sid = begin(server, "behind-a-human", "approver")
    with server.client() as c:
        parked = c.post(f"/v1/sessions/{sid}/turns", json={"input": "launch"})
        assert parked.status_code == 202 and parked.json()["status"] == "awaiting_input"
        waits_on = parked.json()["id"]
    headers = {SESSION: sid}
    messages: Any = [{"role": "user", "content": "anyone there?"}]
    with pytest.raises(openai.ConflictError) as plain:
        client.chat.completions.create(model="approver", messages=messages, extra_headers=headers)
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="approver", messages=messages, stream=True, extra_headers=headers
    )
    with pytest.raises(openai.APIError) as streamed:
        list(stream)
    with pytest.raises(openai.ConflictError) as answered:
        client.responses.create(model="approver", input="and now?", conversation=sid)
    events = list(
        client.responses.create(model="approver", input="still?", conversation=sid, stream=True)
    )
    assert time.monotonic() - began < 10  # not the decision's deadline (30 s)
    for caught in (plain, streamed, answered):
        assert isinstance(caught.value.body, dict), caught.value
        assert caught.value.body["code"] == "awaiting_input"
        assert waits_on in caught.value.message and "not sent" in caught.value.message
    assert isinstance(events[-1], ResponseErrorEvent) and events[-1].code == "awaiting_input"
    assert waits_on in events[-1].message and "not sent" in events[-1].message
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        assert [(t["status"], t["reason"]) for t in turns[1:]] == [
            ("cancelled", "caller_cancelled")
        ] * 4
        # Decided: the parked turn goes on, and nothing withdrawn runs after it.
        call_id = parked.json()["decisions"][0]["call_id"]
        r = c.post(
            f"/v1/sessions/{sid}/turns/{waits_on}/decisions",
            json={"call_id": call_id, "decision": "deny"},
        )
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        while c.get(f"/v1/sessions/{sid}/turns/{waits_on}").json()["status"] != "completed":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        after = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
        items = c.get(f"/v1/sessions/{sid}/items").json()["data"]
    assert [t["status"] for t in after] == ["completed"] + ["cancelled"] * 4
    said = [i["content"] for i in items if i["kind"] == "user"]
    assert said == ["launch"]


def test_a_stream_queued_behind_a_turn_that_parks_later_ends_saying_so(
    client: openai.OpenAI, server: Server
) -> None:
    """The turn ahead was running when the message came, and waits for a human only later:
    the queued message's stream ends then (withdrawn), not at the decision's deadline."""
    sid = begin(server, "parks-later", "hesitant")
    with server.client() as c:
        ahead = c.post(f"/v1/sessions/{sid}/turns", json={"input": "go", "wait": False})
        assert ahead.status_code == 202, ahead.text
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="hesitant",
        messages=[{"role": "user", "content": "meanwhile"}],
        stream=True,
        extra_headers={SESSION: sid},
    )
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    took = time.monotonic() - began
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "awaiting_input"
    assert ahead.json()["id"] in caught.value.message and "not sent" in caught.value.message
    assert 1.0 < took < 10, took  # after the ponder (1.5 s), well before the deadline (30 s)
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
    assert [t["status"] for t in turns] == ["awaiting_input", "cancelled"]


def test_a_turn_of_two_messages_reads_the_same_streamed_or_not(client: openai.OpenAI) -> None:
    """The model writes a few words, calls a tool, then answers. A stream shows both messages
    as they come; the plain answer and the response object said the last one only, and a
    response's text deltas did not add up to their item's text."""
    both = "Let me shout that.\n\nit says HEY"
    messages: Any = [{"role": "user", "content": "hey"}]
    plain = client.chat.completions.create(model="narrator", messages=messages)
    assert plain.choices[0].message.content == both
    chunks = list(client.chat.completions.create(model="narrator", messages=messages, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == both
    response = client.responses.create(model="narrator", input="hey")
    texts = [
        part.text
        for item in response.output
        if item.type == "message"
        for part in item.content
        if part.type == "output_text"
    ]
    assert texts == ["Let me shout that.", "it says HEY"]
    assert len({item.id for item in response.output}) == 2
    events = list(client.responses.create(model="narrator", input="hey", stream=True))
    deltas: dict[str, str] = {}
    done: dict[str, str] = {}
    for e in events:
        if isinstance(e, ResponseTextDeltaEvent):
            deltas[e.item_id] = deltas.get(e.item_id, "") + e.delta
        elif isinstance(e, ResponseTextDoneEvent):
            done[e.item_id] = e.text
    assert deltas == done and list(done.values()) == ["Let me shout that.", "it says HEY"]
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    assert [i.id for i in final.response.output] == list(done)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    # Read back, streamed again: the same items, the same numbers.
    again = list(client.responses.retrieve(final.response.id, stream=True))
    assert [(e.type, e.sequence_number) for e in again] == [
        (e.type, e.sequence_number) for e in events
    ]
    read = client.responses.retrieve(final.response.id)
    assert [i.id for i in read.output] == list(done)


def test_a_queued_response_is_in_progress_only_once_it_runs(
    client: openai.OpenAI, server: Server
) -> None:
    """Behind a running turn, a streamed response said ``in_progress`` at once, while tether
    had it queued."""
    sid = begin(server, "queued-response", "slow")
    with server.client() as c:
        ahead = c.post(f"/v1/sessions/{sid}/turns", json={"input": "first", "wait": False})
        assert ahead.status_code == 202
    began = time.monotonic()
    seen: list[tuple[str, float]] = []
    first_status = ""
    for e in client.responses.create(model="slow", input="second", conversation=sid, stream=True):
        seen.append((e.type, time.monotonic() - began))
        if e.type == "response.created":
            first_status = e.response.status or ""
    kinds = [k for k, _ in seen]
    assert first_status == "queued"
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert seen[1][1] > 1.0  # the turn ahead streams ~2 s: not before it ended
    with server.client() as c:
        turns = c.get(f"/v1/sessions/{sid}/turns").json()["data"]
    assert [t["status"] for t in turns] == ["completed", "completed"]


def test_models_can_be_read_one_by_one_and_n_is_one(client: openai.OpenAI) -> None:
    assert client.models.retrieve("echo").id == "echo"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("nope")
    assert isinstance(missing.value.body, dict)
    assert missing.value.body["code"] == "model_not_found"
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as two:
        client.chat.completions.create(model="echo", messages=messages, n=2)
    assert isinstance(two.value.body, dict) and two.value.body["param"] == "n"
    one = client.chat.completions.create(model="echo", messages=messages, n=1)
    assert len(one.choices) == 1


def test_a_continuation_that_failed_can_be_sent_again(
    client: openai.OpenAI, fake_openai: FakeOpenAIServer
) -> None:
    """The same message continuing the same response is answered with what the first try
    made, unless that try failed: then sending it again is a new try (a failed turn does not
    move the conversation on), not that failure read back for a day."""
    fake_openai.script("first", FakeError(500, "upstream melted", times=2), "second")
    first = client.responses.create(model="upstream", input="one")
    with pytest.raises(openai.APIError):
        client.responses.create(model="upstream", input="two", previous_response_id=first.id)
    again = client.responses.create(model="upstream", input="two", previous_response_id=first.id)
    assert again.status == "completed" and again.output_text == "second"
    same = client.responses.create(model="upstream", input="two", previous_response_id=first.id)
    assert same.id == again.id
