"""The A2A face, driven by the real ``a2a-sdk`` client against a real ``tether serve``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import (
    A2ACardResolver,
    A2AClientError,
    AuthInterceptor,
    Client,
    ClientCallContext,
    ClientCallInterceptor,
    ClientConfig,
    ClientFactory,
    CredentialService,
    create_client,
)
from a2a.helpers.proto_helpers import new_data_part
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from tests.server.cli_keys import create_key
from tests.server.conftest import Server, ServerFactory, start_server
from tether.testing.fake_openai import FakeError, FakeOpenAIServer

S = pb.TaskState


class Key(CredentialService):
    """Hands the API key to the scheme the agent card names (so the card must name it)."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.asked: list[str] = []

    async def get_credentials(
        self, security_scheme_name: str, context: ClientCallContext | None
    ) -> str | None:
        self.asked.append(security_scheme_name)
        return self.secret


@asynccontextmanager
async def a2a(
    server: Server, agent: str | None = None, *, streaming: bool = True, key: str | None = None
) -> AsyncIterator[Client]:
    """A client made the SDK's way: from the card at ``server``'s base URL (the first agent's)
    or at ``/a2a/{agent}``; with ``key``, authenticated as that card's security scheme says."""
    url = server.url if agent is None else f"{server.url}/a2a/{agent}"
    async with httpx.AsyncClient(timeout=30) as http:
        config = ClientConfig(streaming=streaming, httpx_client=http)
        interceptors: list[ClientCallInterceptor] = [AuthInterceptor(Key(key))] if key else []
        client = await create_client(url, client_config=config, interceptors=interceptors)
        try:
            yield client
        finally:
            await client.close()


def user(
    text: str | None = None,
    *,
    context: str = "",
    task: str = "",
    data: dict[str, Any] | None = None,
    policy: str | None = None,
) -> pb.SendMessageRequest:
    parts = [pb.Part(text=text)] if text is not None else []
    if data is not None:
        parts.append(new_data_part(data))
    message = pb.Message(
        message_id=uuid.uuid4().hex,
        role=pb.Role.ROLE_USER,
        parts=parts,
        context_id=context,
        task_id=task,
    )
    request = pb.SendMessageRequest(message=message)
    if policy is not None:
        request.metadata.update({"policy": policy})
    return request


async def send(client: Client, request: pb.SendMessageRequest) -> pb.Task:
    """The task a non-streaming send answers with."""
    [answer] = [event async for event in client.send_message(request)]
    assert answer.HasField("task"), answer
    return answer.task


async def stream(client: Client, request: pb.SendMessageRequest) -> list[pb.StreamResponse]:
    return [event async for event in client.send_message(request)]


def said(message: pb.Message) -> str:
    return "".join(p.text for p in message.parts if p.WhichOneof("content") == "text")


def data_of(message: pb.Message) -> dict[str, Any]:
    [data] = [MessageToDict(p.data) for p in message.parts if p.WhichOneof("content") == "data"]
    assert isinstance(data, dict)
    return data


def reply_of(task: pb.Task) -> str:
    [artifact] = task.artifacts
    return "".join(p.text for p in artifact.parts)


def assembled(events: Sequence[pb.StreamResponse]) -> str:
    """The reply artifact as a client builds it from the chunks: ``append`` adds, else
    replaces."""
    text = ""
    for event in events:
        if event.HasField("artifact_update"):
            update = event.artifact_update
            chunk = "".join(p.text for p in update.artifact.parts)
            text = text + chunk if update.append else chunk
    return text


def states(events: Sequence[pb.StreamResponse]) -> list[int]:
    return [e.status_update.status.state for e in events if e.HasField("status_update")]


# -- discovery -----------------------------------------------------------------------------------
async def test_the_client_finds_the_card_and_talks_to_the_url_in_it(server: Server) -> None:
    async with a2a(server, streaming=False) as client:
        card = await client.get_extended_agent_card(pb.GetExtendedAgentCardRequest())
        assert card.name == "echo"  # the first agent's card sits at the well-known path
        assert card.capabilities.streaming and not card.capabilities.push_notifications
        urls = {(i.protocol_version, i.url) for i in card.supported_interfaces}
        assert urls == {("1.0", f"{server.url}/a2a/echo"), ("0.3", f"{server.url}/a2a/echo")}
        assert not card.security_schemes  # local mode: no key to ask for
        task = await send(client, user("hello"))
        assert task.status.state == S.TASK_STATE_COMPLETED
        assert reply_of(task) == said(task.status.message) == "saw [] then hello"
    async with a2a(server, "slow", streaming=False) as client:
        card = await client.get_extended_agent_card(pb.GetExtendedAgentCardRequest())
        assert card.name == "slow"
        assert {i.url for i in card.supported_interfaces} == {f"{server.url}/a2a/slow"}
    with server.client() as c:
        raw = c.get("/a2a/approver/.well-known/agent-card.json").json()
        # 0.3 clients read the same card: its url and protocol version are there too.
        assert raw["url"] == f"{server.url}/a2a/approver" and raw["protocolVersion"] == "0.3"
        assert raw["skills"][0]["tags"] == ["tether", "launch"]
        assert c.get("/a2a/nobody/.well-known/agent-card.json").status_code == 404
        # Local mode serves its card as it serves everything: to its own names only.
        foreign = c.get("/.well-known/agent-card.json", headers={"Host": "evil.example"})
        assert foreign.status_code == 403


async def test_one_context_is_one_conversation(server: Server) -> None:
    async with a2a(server, "echo", streaming=False) as client:
        first = await send(client, user("one"))
        assert reply_of(first) == "saw [] then one"
        context = first.context_id
        second = await send(client, user("two", context=context))
        assert second.context_id == context and second.id != first.id
        assert reply_of(second) == "saw [one] then two"
        # A message naming no context starts another conversation.
        other = await send(client, user("three"))
        assert other.context_id != context and reply_of(other) == "saw [] then three"
        # A retried message (its messageId again) is the task it made, not a second turn.
        retried = user("four", context=context)
        fourth = await send(client, retried)
        assert (await send(client, retried)).id == fourth.id
        fifth = await send(client, user("five", context=context))
        assert reply_of(fifth) == "saw [one, two, four] then five"
        retried.message.parts[0].text = "not four"
        with pytest.raises(InvalidParamsError):  # one messageId, another message
            await send(client, retried)
        # tasks/get reads the task back from the store.
        again = await client.get_task(pb.GetTaskRequest(id=first.id))
        assert again.status.state == S.TASK_STATE_COMPLETED and reply_of(again) == reply_of(first)
        assert [said(m) for m in again.history] == ["one"]
        assert MessageToDict(again.metadata)["tether"]["reason"] == "answered"


async def test_streaming_sends_status_and_artifact_events_and_ends_completed(
    server: Server,
) -> None:
    async with a2a(server, "echo") as client:
        events = await stream(client, user("streamed"))
    assert events[0].HasField("task")
    assert events[0].task.status.state == S.TASK_STATE_SUBMITTED
    assert states(events)[0] == S.TASK_STATE_WORKING
    assert states(events)[-1] == S.TASK_STATE_COMPLETED
    assert any(e.HasField("artifact_update") for e in events)
    assert assembled(events) == "saw [] then streamed"
    assert said(events[-1].status_update.status.message) == "saw [] then streamed"
    assert {e.status_update.task_id for e in events if e.HasField("status_update")} == {
        events[0].task.id
    }


async def test_a_retried_message_streams_its_running_task_as_it_stands(server: Server) -> None:
    """A new message's task streams as submitted first, then working, even when its turn was
    started with its admission; a retry of that message (its messageId again) while the turn
    runs gets the task as it stands: working."""

    async def running(events: AsyncIterator[pb.StreamResponse]) -> None:
        async for event in events:  # the reply has begun
            if event.HasField("artifact_update"):
                return

    async with a2a(server, "slow") as client:
        opening = aiter(client.send_message(user("open")))
        opened = (await anext(opening)).task
        await running(opening)
        await client.cancel_task(pb.CancelTaskRequest(id=opened.id))
        asked = user("go", context=opened.context_id)
        events = aiter(client.send_message(asked))
        made = await anext(events)
        assert made.task.status.state == S.TASK_STATE_SUBMITTED
        await running(events)
        again = await anext(aiter(client.send_message(asked)))
        assert again.task.id == made.task.id
        assert again.task.status.state == S.TASK_STATE_WORKING
        done = await client.cancel_task(pb.CancelTaskRequest(id=made.task.id))
        assert done.status.state == S.TASK_STATE_CANCELED


async def test_a_slow_task_is_cancelled_and_watchers_see_it_end(server: Server) -> None:
    async with a2a(server, "slow") as client, a2a(server, "slow") as watcher:
        events = aiter(client.send_message(user("go")))
        first = await anext(events)
        tid = first.task.id
        async for event in events:  # the turn runs: its reply has begun
            if event.HasField("artifact_update"):
                break
        watched = aiter(watcher.subscribe(pb.SubscribeToTaskRequest(id=tid)))
        snapshot = await anext(watched)
        assert snapshot.task.status.state == S.TASK_STATE_WORKING
        done = await client.cancel_task(pb.CancelTaskRequest(id=tid))
        assert done.status.state == S.TASK_STATE_CANCELED
        assert "cancelled" in said(done.status.message)
        assert states([e async for e in events])[-1] == S.TASK_STATE_CANCELED
        assert states([e async for e in watched])[-1] == S.TASK_STATE_CANCELED
        read = await client.get_task(pb.GetTaskRequest(id=tid))
        assert read.status.state == S.TASK_STATE_CANCELED and not read.artifacts
        with pytest.raises(TaskNotCancelableError):
            await client.cancel_task(pb.CancelTaskRequest(id=tid))
        with pytest.raises(UnsupportedOperationError):  # an ended task takes no message
            await send(client, user("more", task=tid))


async def test_a_subscriber_joining_midway_gets_the_reply_so_far_then_the_rest(
    server: Server,
) -> None:
    """Its task came with no artifact and its first chunk was the next word alone: a live view
    showed the reply from the middle until the final chunk replaced it."""
    async with a2a(server, "slow") as client, a2a(server, "slow") as watcher:
        events = aiter(client.send_message(user("go")))
        tid = (await anext(events)).task.id
        seen = 0
        async for event in events:
            if event.HasField("artifact_update"):
                seen += 1
                if seen == 15:
                    break
        await asyncio.sleep(0.4)  # the words so far are stored (a flush a quarter second)
        watched = [e async for e in watcher.subscribe(pb.SubscribeToTaskRequest(id=tid))]
        rest = [e async for e in events]
    chunks = [e.artifact_update for e in watched if e.HasField("artifact_update")]
    first, *more = chunks
    # From the reply's first word (what was stored as it joined comes as one chunk).
    assert not first.append and first.artifact.parts[0].text.startswith("w0 ")
    text = first.artifact.parts[0].text
    for c in more:
        text = text + c.artifact.parts[0].text if c.append else c.artifact.parts[0].text
    assert text == " ".join(f"w{n}" for n in range(40))
    # The last chunk only closes it: the pieces added up.
    assert more[-1].last_chunk and more[-1].append and more[-1].artifact.parts[0].text == ""
    assert states(watched)[-1] == states(rest)[-1] == S.TASK_STATE_COMPLETED


# -- human decisions -----------------------------------------------------------------------------
async def test_an_approval_is_input_required_then_answered(server: Server) -> None:
    async with a2a(server, "approver", streaming=False) as client:
        asked = await send(client, user("launch it"))
        status = asked.status
        assert status.state == S.TASK_STATE_INPUT_REQUIRED
        text = said(status.message)
        assert "launch" in text and '{"target": "rocket"}' in text
        assert "approve, deny or always" in text
        [decision] = data_of(status.message)["decisions"]
        assert (decision["kind"], decision["tool"], decision["arguments"]) == (
            "approval",
            "launch",
            {"target": "rocket"},
        )
        assert decision["verdicts"] == ["approve", "deny", "always"]
        # Not an answer an approval takes: refused, and nothing decided.
        with pytest.raises(InvalidParamsError):
            await send(client, user("maybe", task=asked.id, context=asked.context_id))
        still = await client.get_task(pb.GetTaskRequest(id=asked.id))
        assert still.status.state == S.TASK_STATE_INPUT_REQUIRED
        done = await send(client, user("approve", task=asked.id, context=asked.context_id))
        assert done.id == asked.id and done.status.state == S.TASK_STATE_COMPLETED
        assert reply_of(done) == "tool said: launched rocket"
        # A denial (said as data, without the context: the task names it) ends it too.
        again = await send(client, user("launch again", context=asked.context_id))
        assert again.status.state == S.TASK_STATE_INPUT_REQUIRED
        denied = await send(client, user(task=again.id, data={"verdict": "deny"}))
        assert denied.status.state == S.TASK_STATE_COMPLETED
        assert "launched" not in reply_of(denied)


async def test_a_question_streams_to_input_required_and_the_answer_streams_to_the_end(
    server: Server,
) -> None:
    async with a2a(server, "asker") as client:
        asked = await stream(client, user("pick one"))
        assert states(asked)[-1] == S.TASK_STATE_INPUT_REQUIRED
        question = asked[-1].status_update.status.message
        assert "Which planet?" in said(question) and "Mars, Venus" in said(question)
        [decision] = data_of(question)["decisions"]
        assert decision["choices"] == ["Mars", "Venus"]
        tid, context = asked[0].task.id, asked[0].task.context_id
        with pytest.raises(InvalidParamsError):  # not one of the choices
            await stream(client, user("Pluto", task=tid))
        with pytest.raises(InvalidParamsError):  # the context is not the task's
            await stream(client, user("Mars", task=tid, context="elsewhere"))
        answered = await stream(client, user(task=tid, context=context, data={"answer": "Mars"}))
        assert answered[0].task.id == tid
        assert answered[0].task.status.state == S.TASK_STATE_SUBMITTED  # queued again to go on
        assert states(answered)[0] == S.TASK_STATE_WORKING
        assert states(answered)[-1] == S.TASK_STATE_COMPLETED
        assert assembled(answered) == "noted: The user answered: Mars"


# -- refusals and failures -----------------------------------------------------------------------
async def test_another_users_context_and_tasks_are_refused(make_server: ServerFactory) -> None:
    srv = make_server()
    alice = create_key(srv.data_dir, "alice").secret
    bob = create_key(srv.data_dir, "bob").secret
    async with httpx.AsyncClient(base_url=srv.url) as c:
        for _ in range(200):  # the server caches "are there keys" for a second
            if "securitySchemes" in (await c.get("/.well-known/agent-card.json")).json():
                break
            await asyncio.sleep(0.02)
    async with a2a(srv, "echo", streaming=False, key=alice) as a:
        card = await a.get_extended_agent_card(pb.GetExtendedAgentCardRequest())
        scheme = card.security_schemes["tether"].http_auth_security_scheme
        assert scheme.scheme == "Bearer"
        mine = await send(a, user("alice here"))
        assert reply_of(mine) == "saw [] then alice here"
        async with a2a(srv, "echo", streaming=False, key=bob) as b:
            with pytest.raises(TaskNotFoundError) as caught:
                await send(b, user("bob here", context=mine.context_id))
            assert "omit contextId" in str(caught.value)
            with pytest.raises(TaskNotFoundError):
                await b.get_task(pb.GetTaskRequest(id=mine.id))
            with pytest.raises(TaskNotFoundError):
                await b.cancel_task(pb.CancelTaskRequest(id=mine.id))
            with pytest.raises(TaskNotFoundError):
                await stream(b, user("approve", task=mine.id))
        # Bob's attempt made nothing: Alice's conversation goes on where it was.
        again = await send(a, user("again", context=mine.context_id))
        assert reply_of(again) == "saw [alice here] then again"
        with pytest.raises(TaskNotFoundError):  # a context nobody made
            await send(a, user("hello?", context="never-made"))
    with srv.client(alice) as c:
        assert c.get("/v1/sessions/never-made").status_code == 404
    async with a2a(srv, "echo", streaming=False) as anonymous:
        with pytest.raises(A2AClientError, match="401"):
            await send(anonymous, user("who am I?"))


async def test_a_failing_model_fails_the_task(
    server: Server, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeError(500, "upstream melted", times=2), "fine now")
    async with a2a(server, "upstream", streaming=False) as client:
        failed = await send(client, user("doomed"))
        assert failed.status.state == S.TASK_STATE_FAILED
        assert "model provider failed" in said(failed.status.message)
        assert not failed.artifacts
        assert "Traceback" not in said(failed.status.message)
        fine = await send(client, user("again", context=failed.context_id))
        assert fine.status.state == S.TASK_STATE_COMPLETED and reply_of(fine) == "fine now"


@pytest.mark.parametrize("where", ["request", "message"])
async def test_a_busy_context_rejects_with_the_reject_policy(server: Server, where: str) -> None:
    """``metadata.policy`` of the request or of its message (sent in the message's, it was
    ignored: the message queued and ran)."""
    async with a2a(server, "slow") as client, a2a(server, "slow", streaming=False) as other:
        events = aiter(client.send_message(user("long")))
        first = await anext(events)
        async for event in events:
            if event.HasField("artifact_update"):
                break
        asked = user("now", context=first.task.context_id)
        holder = asked if where == "request" else asked.message
        holder.metadata.update({"policy": "reject"})
        busy = await send(other, asked)
        assert busy.status.state == S.TASK_STATE_REJECTED
        assert busy.context_id == first.task.context_id and said(busy.status.message)
        with pytest.raises(TaskNotFoundError):  # nothing was stored for it
            await other.get_task(pb.GetTaskRequest(id=busy.id))
        await other.cancel_task(pb.CancelTaskRequest(id=first.task.id))
        assert states([e async for e in events])[-1] == S.TASK_STATE_CANCELED


async def test_tasks_live_in_the_store_for_every_process(tmp_path: Path) -> None:
    one = start_server(tmp_path / "shared")
    two = start_server(tmp_path / "shared")  # another process on the same store
    try:
        async with a2a(one, "echo", streaming=False) as a, a2a(two, "slow") as b:
            made = await send(a, user("kept"))
            read = await b.get_task(pb.GetTaskRequest(id=made.id))
            assert read.status.state == S.TASK_STATE_COMPLETED and reply_of(read) == reply_of(made)
            events = aiter(b.send_message(user("slowly")))
            tid = (await anext(events)).task.id
            async for event in events:
                if event.HasField("artifact_update"):
                    break
            cancelled = await a.cancel_task(pb.CancelTaskRequest(id=tid))  # the other process
            assert cancelled.status.state == S.TASK_STATE_CANCELED
            assert states([e async for e in events])[-1] == S.TASK_STATE_CANCELED
    finally:
        one.stop()
        two.stop()


# -- A2A 0.3 and the wire ------------------------------------------------------------------------
async def test_a_0_3_client_gets_the_0_3_spelling(server: Server) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, f"{server.url}/a2a/echo").get_agent_card()
        legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(legacy)
        old = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        first = await send(old, user("old"))
        assert reply_of(first) == "saw [] then old"
        old_stream = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        events = await stream(old_stream, user("older", context=first.context_id))
        assert states(events)[-1] == S.TASK_STATE_COMPLETED
        assert assembled(events) == "saw [old] then older"
        read = await old.get_task(pb.GetTaskRequest(id=first.id))
        assert read.status.state == S.TASK_STATE_COMPLETED
    with server.client() as c:
        body = {"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": first.id}}
        task = c.post("/a2a/echo", json=body).json()["result"]
        assert (task["kind"], task["status"]["state"]) == ("task", "completed")
        body["params"] = {"id": "nope/t_nope"}
        err = c.post("/a2a/echo", json=body).json()
        assert err["id"] == 7 and err["error"]["code"] == -32001


def rpc(server: Server, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    with server.client() as c:
        if isinstance(body, bytes):
            return c.post("/a2a/echo", content=body, headers=headers)
        return c.post("/a2a/echo", json=body, headers=headers)


def call(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": "x", "method": method, "params": params}


def code(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    error = response.json()["error"]
    assert error["message"] and "Traceback" not in response.text
    number: int = error["code"]
    return number


def test_bad_requests_are_json_rpc_errors(server: Server) -> None:
    hello = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    unparsed = rpc(server, b"{not json")
    assert code(unparsed) == -32700
    assert "INTERNAL_ERROR" not in unparsed.text  # the caller's fault, not the server's
    assert code(rpc(server, [call("GetTask", {"id": "a"})])) == -32600  # no batches
    assert code(rpc(server, {"id": 1, "method": "GetTask"})) == -32600  # no jsonrpc: 2.0
    assert code(rpc(server, call("DoSomething", {}))) == -32601
    assert code(rpc(server, call("CreateTaskPushNotificationConfig", {}))) == -32003
    assert code(rpc(server, call("ListTasks", {}))) == -32004
    assert code(rpc(server, call("SendMessage", {"message": {"parts": "no"}}))) == -32602
    assert code(rpc(server, call("SendMessage", {}))) == -32602  # no message
    agent_said = {**hello, "role": "ROLE_AGENT"}
    assert code(rpc(server, call("SendMessage", {"message": agent_said}))) == -32602
    a_file = {**hello, "parts": [{"url": "https://example.com/x.png"}]}
    assert code(rpc(server, call("SendMessage", {"message": a_file}))) == -32005
    bad_policy = {"message": hello, "metadata": {"policy": "shout"}}
    assert code(rpc(server, call("SendMessage", bad_policy))) == -32602
    assert code(rpc(server, call("GetTask", {"id": "not a task id"}))) == -32001
    assert code(rpc(server, call("message/send", {"message": {"role": "user"}}))) == -32602
    versioned = rpc(server, call("GetTask", {"id": "a"}), headers={"A2A-Version": "2.0"})
    assert code(versioned) == -32009
    with server.client() as c:
        unknown = c.post("/a2a/nobody", json=call("SendMessage", {"message": hello}))
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == -32601
        # The same principal as every door: local mode takes no message from another origin.
        elsewhere = c.post(
            "/a2a/echo",
            json=call("SendMessage", {"message": hello}),
            headers={"Origin": "http://evil.example"},
        )
        assert elsewhere.status_code == 403 and elsewhere.json()["error"]["code"] == -32600


def test_the_face_can_be_switched_off(make_server: ServerFactory) -> None:
    srv = make_server(env={"TETHER_FACES_A2A": "off"})
    with srv.client() as c:
        assert c.get("/.well-known/agent-card.json").status_code == 404
        assert c.get("/a2a/echo/.well-known/agent-card.json").status_code == 404
        assert c.post("/a2a/echo", json=call("GetTask", {"id": "a"})).status_code == 404
        assert c.get("/v1/agents").status_code == 200
