"""The OpenAI-compatible face, driven by the real ``openai`` SDK against a real server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import openai
import pytest

from tests.server.cli_keys import Key, create_key
from tests.server.conftest import Server, ServerFactory
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

SESSION = "X-Tether-Session"


def sdk(server: Server, key: str | None = None) -> openai.OpenAI:
    """A client of the server; with no key, local mode, where the key the SDK insists on is a
    placeholder. No retries: a retried request would be a second turn."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key or "sk-local", max_retries=0)


def users(server: Server, *names: str) -> list[Key]:
    """An API key for each of ``names``, once the server answers to them (it caches whether
    any key exists for a second)."""
    keys = [create_key(server.data_dir, name) for name in names]
    with sdk(server, keys[0].secret) as c:
        for _ in range(200):
            try:
                c.models.list()
                break
            except openai.AuthenticationError:
                time.sleep(0.02)
    return keys


def begin(server: Server, session: str, agent: str = "echo", key: str | None = None) -> str:
    """Make the caller's session ``session`` (a header naming an unknown one is a 404)."""
    with server.client(key) as c:
        r = c.post("/v1/sessions", json={"session_id": session, "agent": agent})
        assert r.status_code == 201, r.text
    return session


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    with sdk(server) as c:
        yield c


def say(c: openai.OpenAI, *texts: str, session: str | None = None, model: str = "echo") -> str:
    headers = {SESSION: session} if session else None
    messages = [{"role": "user", "content": t} for t in texts]
    reply = c.chat.completions.create(
        model=model,
        messages=messages,  # type: ignore[arg-type]
        extra_headers=headers,
    )
    return reply.choices[0].message.content or ""


def test_models_lists_the_apps_agents(client: openai.OpenAI) -> None:
    models = client.models.list().data
    names = [m.id for m in models]
    assert names[:3] == ["echo", "slow", "approver"]
    assert all(m.owned_by == "tether" and m.object == "model" for m in models)


def test_a_completion_has_openais_shape_and_names_its_session(
    client: openai.OpenAI, server: Server
) -> None:
    begin(server, "shape-1")
    raw = client.chat.completions.with_raw_response.create(
        model="echo",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={SESSION: "shape-1"},
    )
    assert raw.headers[SESSION] == "shape-1"
    reply = raw.parse()
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == "echo"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "saw [] then hello"
    assert choice.finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_session_continues_and_resent_history_is_not_duplicated(
    client: openai.OpenAI, server: Server
) -> None:
    begin(server, "conv-1")
    assert say(client, "one", session="conv-1") == "saw [] then one"
    assert say(client, "two", session="conv-1") == "saw [one] then two"
    # A client that resends the whole conversation: only the last user message is new.
    assert say(client, "one", "two", "three", session="conv-1") == "saw [one, two] then three"
    # metadata.session_id names the session too.
    reply = client.chat.completions.create(
        model="echo",
        messages=[{"role": "user", "content": "four"}],
        metadata={"session_id": "conv-1"},
    )
    assert reply.choices[0].message.content == "saw [one, two, three] then four"
    # Both, naming different sessions: refused (the header used to win, silently).
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model="echo",
            messages=[{"role": "user", "content": "five"}],
            metadata={"session_id": "conv-other"},
            extra_headers={SESSION: "conv-1"},
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "metadata"


def test_a_messages_text_parts_are_one_line_each(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="echo",
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "parts"}],
            }
        ],
    )
    assert reply.choices[0].message.content == "saw [] then two\nparts"


def test_a_conversation_ending_with_the_reply_is_refused_and_stores_nothing(
    client: openai.OpenAI, server: Server
) -> None:
    # Before, its last user message was answered again: a second turn of the same words.
    begin(server, "ends-1")
    assert say(client, "hi", session="ends-1") == "saw [] then hi"
    for api, last in [("chat", "assistant"), ("responses", "assistant"), ("chat", "tool")]:
        with pytest.raises(openai.BadRequestError) as caught:
            said = [{"role": "user", "content": "hi"}, {"role": last, "content": "yo"}]
            if last == "tool":
                said[-1]["tool_call_id"] = "call_1"
            if api == "chat":
                client.chat.completions.create(
                    model="echo",
                    messages=said,  # type: ignore[arg-type]
                    extra_headers={SESSION: "ends-1"},
                )
            else:
                client.responses.create(model="echo", input=said, conversation="ends-1")  # type: ignore[arg-type]
        assert isinstance(caught.value.body, dict)
        assert "nothing new to answer" in caught.value.body["message"]
    with server.client() as c:
        turns = c.get("/v1/sessions/ends-1/turns").json()["data"]
    assert [t["input"] for t in turns] == ["hi"]


def test_without_a_session_each_call_is_fresh(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": "a"}]
    )
    assert raw.parse().choices[0].message.content == "saw [] then a"
    first = raw.headers[SESSION]
    raw = client.chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": "b"}]
    )
    assert raw.parse().choices[0].message.content == "saw [] then b"
    assert raw.headers[SESSION] != first


def test_an_unknown_model_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        say(client, "hi", model="nobody")
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "model_not_found"
    assert body["type"] == "not_found_error" and body["param"] == "model"


def test_bad_bodies_are_openai_errors(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="echo", messages=[{"role": "system", "content": "x"}])
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "messages"
    with server.client() as c:
        r = c.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_failed_model_is_an_error_not_an_answer(
    client: openai.OpenAI, server: Server, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    begin(server, "face-fail", "upstream")
    with pytest.raises(openai.APIStatusError) as caught:
        say(client, "doomed", session="face-fail", model="upstream")
    assert caught.value.status_code == 502
    assert "Traceback" not in caught.value.response.text
    # Its code is spelt as OpenAI's are (and as the other faces spell tether's own).
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "turn_failed"
    assert say(client, "again", session="face-fail", model="upstream") == "fine now"


def test_a_turn_awaiting_a_decision_is_a_409(client: openai.OpenAI, server: Server) -> None:
    begin(server, "face-ask", "asker")
    with pytest.raises(openai.ConflictError) as caught:
        say(client, "hello", session="face-ask", model="asker")
    assert "decide" in caught.value.message
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_a_cancelled_turn_is_a_409(client: openai.OpenAI, server: Server) -> None:
    begin(server, "face-cancel", "slow")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            say(client, "go", session="face-cancel", model="slow")
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    with server.client() as c:
        running: list[dict[str, object]] = []
        for _ in range(400):
            r = c.get("/v1/sessions/face-cancel/turns")
            if r.status_code == 200:
                running = [t for t in r.json()["data"] if t["status"] == "running"]
                if running:
                    break
            time.sleep(0.01)
        assert running, "the turn never started"
        c.post(f"/v1/sessions/face-cancel/turns/{running[0]['id']}/cancel")
    worker.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], openai.ConflictError)


def test_two_users_sessions_with_one_id_stay_apart(make_server: ServerFactory) -> None:
    srv = make_server()
    alice, bob = users(srv, "alice", "bob")
    with sdk(srv, alice.secret) as a, sdk(srv, bob.secret) as b:
        begin(srv, "shared", key=alice.secret)
        assert say(a, "alice here", session="shared") == "saw [] then alice here"
        # Bob naming Alice's session: OpenAI's 404, as for any session he does not have.
        with pytest.raises(openai.NotFoundError) as caught:
            say(b, "bob here", session="shared")
        assert isinstance(caught.value.body, dict)
        assert caught.value.body["code"] == "session_not_found"
        begin(srv, "shared", key=bob.secret)
        assert say(b, "bob here", session="shared") == "saw [] then bob here"
        assert say(a, "again", session="shared") == "saw [alice here] then again"
    # Once keys exist, the placeholder local mode took is refused like any unknown key.
    for secret in ("tk_00000000_not-a-real-key-at-all-000000", "sk-local"):
        with sdk(srv, secret) as nobody, pytest.raises(openai.AuthenticationError):
            nobody.models.list()


def test_an_unknown_session_is_a_404_and_makes_nothing(
    client: openai.OpenAI, server: Server
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        say(client, "hello?", session="never-made")
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["code"] == "session_not_found"
    # The header a client reads the session to go on with from names none.
    assert "x-tether-session" not in caught.value.response.headers
    with server.client() as c:
        assert c.get("/v1/sessions/never-made").status_code == 404


def test_the_face_can_be_switched_off(make_server: ServerFactory) -> None:
    srv = make_server(env={"TETHER_FACES_OPENAI": "off"})
    with srv.client() as c:
        assert c.get("/v1/models").status_code == 404
        assert c.get("/v1/agents").status_code == 200


def test_a_session_id_no_header_can_hold_is_a_400(server: Server) -> None:
    body = {
        "model": "nobody",
        "metadata": {"session_id": "\U0001d0c2 not an id"},
        "messages": [{"role": "user", "content": "hi"}],
    }
    with server.client() as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "metadata"
    assert SESSION not in r.headers


def test_a_one_off_calls_session_is_kept_a_while_not_for_ever(
    client: openai.OpenAI, server: Server, make_server: ServerFactory
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="echo", messages=[{"role": "user", "content": "once"}]
    )
    with server.client() as c:
        record = c.get(f"/v1/sessions/{raw.headers[SESSION]}").json()
    assert record["expires_at"] - record["created_at"] == pytest.approx(30 * 86400, abs=5)
    # A session the caller made stays until told otherwise.
    kept = begin(server, "kept-1")
    say(client, "hello", session=kept)
    with server.client() as c:
        assert c.get(f"/v1/sessions/{kept}").json()["expires_at"] is None
    # Kept that long after its latest turn, not after its first: a client that goes on with
    # it (as the README says to, with the header it got) does not lose it while it talks.
    brief = make_server(env={"TETHER_ONE_OFF_TTL": "3"})
    with sdk(brief) as b:
        raw = b.chat.completions.with_raw_response.create(
            model="echo", messages=[{"role": "user", "content": "once"}]
        )
        sid = raw.headers[SESSION]
        time.sleep(1.6)
        assert say(b, "twice", session=sid) == "saw [once] then twice"
        with brief.client() as c:
            record = c.get(f"/v1/sessions/{sid}").json()
        assert record["expires_at"] - record["updated_at"] == pytest.approx(3, abs=0.01)
        time.sleep(1.9)  # past three seconds from the start, not from the latest turn
        assert say(b, "thrice", session=sid) == "saw [once, twice] then thrice"
        time.sleep(3.3)
        with pytest.raises(openai.NotFoundError):
            say(b, "gone", session=sid)


def _turns(server: Server, session: str) -> list[dict[str, object]]:
    with server.client() as c:
        data: list[dict[str, object]] = c.get(f"/v1/sessions/{session}/turns").json()["data"]
    return data


def test_the_sdks_own_retries_never_make_a_second_turn(
    server: Server, fake_openai: FakeOpenAIServer
) -> None:
    session = begin(server, "no-retry", "upstream")
    fake_openai.script(FakeError(500, "down", times=2))
    # The SDK's defaults: two retries of a 5xx. The turn ran (tether retried its model):
    # one failed turn, not three.
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="sk-local") as retrying,
        pytest.raises(openai.APIStatusError) as caught,
    ):
        say(retrying, "doomed", session=session, model="upstream")
    assert caught.value.status_code == 502
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert [t["status"] for t in _turns(server, session)] == ["failed"]


def test_an_idempotency_key_makes_a_retry_the_same_turn(server: Server) -> None:
    session = begin(server, "idem-1")
    body = {"model": "echo", "messages": [{"role": "user", "content": "once"}]}
    headers = {SESSION: session, "Idempotency-Key": "retry-me-1"}
    with server.client() as c:
        first = c.post("/v1/chat/completions", json=body, headers=headers)
        again = c.post("/v1/chat/completions", json=body, headers=headers)
        bad = c.post("/v1/chat/completions", json=body, headers={"Idempotency-Key": "a b"})
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert len(_turns(server, session)) == 1
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_value"
