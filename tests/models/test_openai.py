"""The ``openai`` provider against a real HTTP server: tether's fake OpenAI-compatible one."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator

import httpx2
import openai
import pytest

from tether.errors import ConfigError, ModelError, ModelRequestsForbidden
from tether.models import (
    Finish,
    Message,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    resolve_model,
)
from tether.models.openai import TRANSPORT_ENV, OpenAIModel
from tether.testing.fake_openai import FakeCut, FakeError, FakeOpenAIServer, FakeToolCall

ADD_TOOL = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


@pytest.fixture(autouse=True, params=["httpx", "aiohttp"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on both of the SDK's transports: the default (httpx2) one scripts get
    and the aiohttp one the server uses (models/openai.py: use_server_transport)."""
    monkeypatch.setenv(TRANSPORT_ENV, request.param)
    return str(request.param)


@pytest.fixture(scope="module")
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def fake(server: FakeOpenAIServer) -> FakeOpenAIServer:
    server.reset()
    return server


@pytest.fixture
async def model(fake: FakeOpenAIServer) -> AsyncIterator[OpenAIModel]:
    m = OpenAIModel("fake-model", base_url=fake.base_url)
    yield m
    await m.aclose()


def ask(text: str, *, system: str = "You are terse.") -> ModelRequest:
    return ModelRequest(messages=(Message("system", system), Message("user", text)))


async def collect(model: OpenAIModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


@pytest.mark.real_model
async def test_streams_text_in_deltas_then_usage_and_finish(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    events = await collect(model, ask("hello there general kenobi"))

    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert "".join(texts) == "echo: hello there general kenobi"
    assert isinstance(events[-2], Usage) and events[-2].output_tokens > 0
    assert events[-1] == Finish("stop")

    [sent] = fake.requests
    assert sent["model"] == "fake-model"
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hello there general kenobi"},
    ]
    assert "tools" not in sent and "temperature" not in sent


@pytest.mark.real_model
async def test_a_slow_model_streams_a_delta_a_word_and_words_that_come_together_are_one(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    """A delta is what one read of the connection brought: a model that writes its words
    30 ms apart gives one delta a word, as it wrote them; one that writes them at once gives
    them in as many deltas as reads took them in (with aiohttp, often one), the text the
    same."""
    fake.chunk_delay_ms = 30
    try:
        slow = await collect(model, ask("one two three four"))
    finally:
        fake.chunk_delay_ms = 0
    words = [e.text for e in slow if isinstance(e, TextDelta)]
    assert words == ["echo:", " one", " two", " three", " four"]
    fast = [
        e.text for e in await collect(model, ask("one two three four")) if isinstance(e, TextDelta)
    ]
    assert "".join(fast) == "echo: one two three four"
    assert len(fast) <= len(words)


def _recording(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[httpx2.Request], httpx2.Response]
) -> None:
    """Every OpenAIModel made from now on sends on an httpx client that ``answer`` serves."""
    import tether.models.openai as module

    monkeypatch.setattr(
        module,
        "_http_client",
        lambda url, timeout: openai.DefaultAsyncHttpxClient(
            timeout=timeout, transport=httpx2.MockTransport(answer)
        ),
    )


SSE_HI = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
# A gateway's own headers, as OPENAI_CUSTOM_HEADERS often gives them: in lower case.
GATEWAY = "authorization: Bearer gateway-token\nuser-agent: my-app/1.0\nx-stainless-retry-count: 7"


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("base_url", "custom"),
    [
        ("http://models.test/v1", None),
        ("http://models.test:8080/openai/v1/", None),
        ("https://api.openai.com/v1", None),
        ("http://models.test/v1?api-version=2024-10-21", None),
        ("http://models.test/v1", GATEWAY),
    ],
)
async def test_a_request_is_the_one_the_sdk_would_send(
    monkeypatch: pytest.MonkeyPatch, base_url: str, custom: str | None
) -> None:
    """tether sends its chat requests on the SDK's HTTP client but not through ``client.post``
    (models/openai_send.py): the upstream must see the same request either way: method, URL
    (a query string in the base URL as the SDK joins it), every header (the key, the SDK's
    own, custom headers over them whatever their case, a cookie an earlier answer set), body."""
    if custom is not None:
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", custom)
    seen: list[httpx2.Request] = []

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(
            200,
            # A load balancer's sticky-session cookie: the client sends it back after.
            headers={"content-type": "text/event-stream", "set-cookie": "lb=node-2; Path=/"},
            content=SSE_HI,
        )

    _recording(monkeypatch, answer)
    model = OpenAIModel("gpt-test", base_url=base_url, api_key="sk-the-key", timeout=12.5)
    try:
        for _ in range(2):
            events = await collect(model, ask("hello"))
            assert events[-1] == Finish("stop")
        body = seen[0].content
        await model._get_client().post(
            "/chat/completions", content=body, cast_to=httpx2.Response, stream=True
        )
    finally:
        await model.aclose()
    first, ours, sdks = seen
    assert "cookie" not in first.headers and ours.headers["cookie"] == "lb=node-2"
    assert (ours.method, str(ours.url)) == (sdks.method, str(sdks.url))
    if "?" not in base_url:
        assert str(ours.url) == base_url.rstrip("/") + "/chat/completions"
    assert sorted(ours.headers.multi_items()) == sorted(sdks.headers.multi_items())
    if custom is None:
        assert ours.headers["authorization"] == "Bearer sk-the-key"
        assert ours.headers["x-stainless-retry-count"] == "0"
    else:
        # Once each: the gateway's token in place of the key, never beside it.
        assert ours.headers.get_list("authorization") == ["Bearer gateway-token"]
        assert ours.headers.get_list("user-agent") == ["my-app/1.0"]
        assert ours.headers["x-stainless-retry-count"] == "0"  # the SDK's, over custom ones
    assert ours.headers["x-stainless-read-timeout"] == "12.5"
    assert ours.content == sdks.content
    assert ours.extensions["timeout"] == sdks.extensions["timeout"]


@pytest.mark.real_model
async def test_a_request_that_races_aclose_goes_out_on_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model's first request works out its route off the event loop; an aclose meanwhile
    closes that client. The request then goes out on a new one (it failed with the HTTP
    client's RuntimeError, an internal error of the turn's)."""
    _recording(monkeypatch, lambda request: httpx2.Response(200, content=SSE_HI))
    model = OpenAIModel("gpt-test", base_url="http://models.test/v1", api_key="k")
    try:
        call = asyncio.create_task(collect(model, ask("hello")))
        await asyncio.sleep(0)  # the call is waiting for its route
        await model.aclose()
        assert (await call)[-1] == Finish("stop")
    finally:
        await model.aclose()


@pytest.mark.real_model
async def test_an_answer_that_cannot_be_decoded_is_a_model_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    packed = gzip.compress(SSE_HI)
    broken = packed[:12] + b"\x00" * 8 + packed[20:]

    class Body(httpx2.AsyncByteStream):  # streamed, as a real transport's body is
        async def __aiter__(self) -> AsyncIterator[bytes]:
            yield broken

    _recording(
        monkeypatch,
        lambda request: httpx2.Response(200, headers={"content-encoding": "gzip"}, stream=Body()),
    )
    model = OpenAIModel("gpt-test", base_url="http://models.test/v1", api_key="k")
    try:
        with pytest.raises(ModelError, match="answer could not be read") as caught:
            await collect(model, ask("hello"))
        assert caught.value.transient
    finally:
        await model.aclose()


@pytest.mark.parametrize(
    "base_url", ["ftp://models.test/v1", "models.test/v1", "http://models.test:99999/v1"]
)
def test_a_base_url_requests_cannot_go_to_is_a_config_error(base_url: str) -> None:
    with pytest.raises(ConfigError, match="OpenAI base URL"):
        OpenAIModel("gpt-test", base_url=base_url, api_key="k")


@pytest.mark.real_model
async def test_sends_options_to_a_compatible_server(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    request = ModelRequest(
        messages=(Message("user", "hi"),), tools=(ADD_TOOL,), temperature=0.0, max_output_tokens=7
    )
    await collect(model, request)

    [sent] = fake.requests
    assert sent["temperature"] == 0.0
    # A custom base_url means a compatible server: the widely understood max_tokens.
    assert sent["max_tokens"] == 7 and "max_completion_tokens" not in sent
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": ADD_TOOL.parameters,
            },
        }
    ]


@pytest.mark.real_model
async def test_tool_call_round_trip(model: OpenAIModel, fake: FakeOpenAIServer) -> None:
    fake.script(FakeToolCall("add", '{"a": 2, "b": 40}', id="call_add_1"), "It is 42.")
    first = ModelRequest(messages=(Message("user", "What is 2 + 40?"),), tools=(ADD_TOOL,))

    events = await collect(model, first)

    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert len(deltas) > 1
    assert {d.index for d in deltas} == {0}
    assert [d.id for d in deltas if d.id] == ["call_add_1"]
    assert [d.name for d in deltas if d.name] == ["add"]
    arguments = "".join(d.arguments for d in deltas)
    assert json.loads(arguments) == {"a": 2, "b": 40}
    assert not any(isinstance(e, TextDelta) for e in events)
    assert events[-1] == Finish("tool_calls")

    second = ModelRequest(
        messages=(
            *first.messages,
            Message("assistant", "", tool_calls=(ToolCall("call_add_1", "add", arguments),)),
            Message("tool", "42", tool_call_id="call_add_1"),
        ),
        tools=(ADD_TOOL,),
    )
    events = await collect(model, second)

    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is 42."
    assert events[-1] == Finish("stop")
    sent = fake.requests[1]["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_add_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'},
            }
        ],
    }
    assert sent[2] == {"role": "tool", "content": "42", "tool_call_id": "call_add_1"}


@pytest.mark.real_model
async def test_parallel_tool_calls_keep_their_indexes(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script((FakeToolCall("add", '{"a": 1, "b": 2}'), FakeToolCall("add", '{"a": 3, "b": 4}')))

    events = await collect(model, ask("two sums"))

    calls: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallDelta):
            calls[e.index] = calls.get(e.index, "") + e.arguments
    assert {i: json.loads(a) for i, a in calls.items()} == {
        0: {"a": 1, "b": 2},
        1: {"a": 3, "b": 4},
    }
    assert events[-1] == Finish("tool_calls")


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("status", "transient"), [(429, True), (500, True), (503, True), (400, False), (401, False)]
)
async def test_http_errors_are_classified(
    model: OpenAIModel,
    fake: FakeOpenAIServer,
    status: int,
    transient: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake.script(FakeError(status, "the fake says no"))

    with pytest.raises(ModelError) as caught:
        await collect(model, ask("hi"))

    assert caught.value.transient is transient
    assert caught.value.status == status
    # Callers get a sentence of ours; the upstream's own words go to the log only.
    assert str(caught.value).startswith(
        f"openai:fake-model: the model provider answered HTTP {status} ("
    )
    assert "the fake says no" not in str(caught.value)
    assert "the fake says no" in caplog.text
    # The error was consumed: the next request succeeds.
    assert (await collect(model, ask("again")))[-1] == Finish("stop")


@pytest.mark.real_model
async def test_persistent_500_fails_every_attempt(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    fake.script(FakeError(500, "down for maintenance", times=3))

    for _ in range(3):
        with pytest.raises(ModelError) as caught:
            await collect(model, ask("hi"))
        assert caught.value.transient and caught.value.status == 500
    assert len(fake.requests) == 3  # no retries inside the provider: the turn loop owns them


@pytest.mark.real_model
async def test_malformed_request_is_not_transient(
    model: OpenAIModel, fake: FakeOpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    # A tool message without a call id is rejected by the fake, as OpenAI would (400).
    bad = ModelRequest(messages=(Message("user", "hi"), Message("tool", "42", tool_call_id="")))

    with pytest.raises(ModelError) as caught:
        await collect(model, bad)

    assert not caught.value.transient and caught.value.status == 400
    assert "tool_call_id" in caplog.text and "tool_call_id" not in str(caught.value)


@pytest.mark.real_model
async def test_cut_stream_is_a_transient_error(model: OpenAIModel, fake: FakeOpenAIServer) -> None:
    fake.script(FakeCut("half an ans"))
    seen: list[ModelEvent] = []

    with pytest.raises(ModelError) as caught:
        async for event in model.stream(ask("hi")):
            seen.append(event)

    assert caught.value.transient and caught.value.status is None
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "half an ans"
    assert not any(isinstance(e, Finish) for e in seen)


@pytest.mark.real_model
async def test_connection_refused_is_transient(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port any more.
    url = f"http://someone:pa55word@127.0.0.1:{port}/v1"
    model = OpenAIModel("fake-model", base_url=url, api_key="sk-0123456789", timeout=5)
    try:
        with pytest.raises(ModelError) as caught:
            await collect(model, ask("hi"))
    finally:
        await model.aclose()

    assert caught.value.transient and caught.value.status is None
    assert str(caught.value) == "openai:fake-model: the model provider could not be reached"
    # The log says where (the password masked) and why.
    assert f"http://***@127.0.0.1:{port}/v1" in caplog.text
    assert "ConnectError" in caplog.text
    assert "pa55word" not in caplog.text


@pytest.mark.real_model
async def test_a_refused_connection_is_unreachable_not_a_timeout_on_either_transport() -> None:
    # The SDK's aiohttp transport (the server's) calls a refused connection a ConnectTimeout;
    # the turn's error must still say what happened, not that the provider was slow.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIModel("fake-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    try:
        with pytest.raises(ModelError) as caught:
            await collect(model, ask("hi"))
    finally:
        await model.aclose()
    assert caught.value.transient and caught.value.status is None
    assert str(caught.value) == "openai:fake-model: the model provider could not be reached"


@pytest.mark.real_model
async def test_a_provider_that_hangs_up_is_unreachable_not_a_timeout_on_either_transport() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)  # part of the request, then the connection closes unanswered
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    model = OpenAIModel("fake-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    try:
        with pytest.raises(ModelError) as caught:
            await collect(model, ask("hi"))
    finally:
        await model.aclose()
        server.close()
    assert caught.value.transient
    assert str(caught.value) == "openai:fake-model: the model provider could not be reached"


@pytest.mark.real_model
async def test_a_provider_slower_than_the_timeout_is_a_timeout_on_either_transport() -> None:
    async with FakeOpenAIServer(latency_ms=3000) as slow:
        model = OpenAIModel("fake-model", base_url=slow.base_url, api_key="x", timeout=0.3)
        try:
            with pytest.raises(ModelError) as caught:
                await collect(model, ask("hi"))
        finally:
            await model.aclose()
    assert caught.value.transient
    assert str(caught.value) == "openai:fake-model: the model provider did not answer within 0.3s"


@pytest.mark.real_model
async def test_consumer_stopping_early_releases_the_stream(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    stream = model.stream(ask("one two three four five six"))
    assert isinstance(stream, AsyncGenerator)  # the provider is an async generator
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    await stream.aclose()

    # The released connection does not wedge the client.
    assert (await collect(model, ask("next")))[-1] == Finish("stop")


@pytest.mark.real_model
async def test_cancelled_consumer_leaves_the_model_usable() -> None:
    async with FakeOpenAIServer(latency_ms=300) as slow:
        model = OpenAIModel("fake-model", base_url=slow.base_url)
        try:
            task = asyncio.create_task(collect(model, ask("never mind")))
            for _ in range(500):  # wait until the request is in flight
                if slow.requests:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (await collect(model, ask("next")))[-1] == Finish("stop")
        finally:
            await model.aclose()


@pytest.mark.real_model
async def test_label_names_the_model_in_errors(fake: FakeOpenAIServer) -> None:
    model = OpenAIModel("m", base_url=fake.base_url, label="custom:m")
    assert model.name == "custom:m"
    fake.script(FakeError(404, "no such model"))
    try:
        with pytest.raises(ModelError, match=r"^custom:m: .* HTTP 404 \(unknown model"):
            await collect(model, ask("hi"))
    finally:
        await model.aclose()


@pytest.mark.real_model
async def test_env_vars_configure_the_client(
    fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    model = OpenAIModel("gpt-test")
    assert model.name == "openai:gpt-test"
    assert model.base_url == fake.base_url
    try:
        events = await collect(model, ask("from env"))
        client = model._get_client()
        assert client.api_key == "sk-from-env"
    finally:
        await model.aclose()
    assert events[-1] == Finish("stop")
    assert fake.requests[0]["model"] == "gpt-test"


def test_arguments_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.invalid/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    model = OpenAIModel("m", base_url="http://arg.invalid/v1", api_key="sk-arg")
    assert model.base_url == "http://arg.invalid/v1"
    assert model._api_key == "sk-arg"


def test_missing_api_key_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o-mini")
    # A local server needs no key: a placeholder satisfies the SDK.
    local = OpenAIModel("llama", base_url="http://127.0.0.1:8080/v1")
    assert local._api_key == "not-needed"


def test_default_base_url_is_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    model = OpenAIModel("gpt-4o-mini")
    assert model.base_url == "https://api.openai.com/v1"
    assert model.context_window == 128_000


def test_ollama_spec_points_at_the_local_ollama(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLLAMA_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = resolve_model("ollama:llama3.2-test-only")
    assert isinstance(model, OpenAIModel)
    assert model.base_url == "http://127.0.0.1:11434/v1"
    assert model.model == "llama3.2-test-only"
    assert model.name == "ollama:llama3.2-test-only"


async def test_stream_is_forbidden_without_the_real_model_marker(
    model: OpenAIModel, fake: FakeOpenAIServer
) -> None:
    with pytest.raises(ModelRequestsForbidden):
        await collect(model, ask("hi"))
    assert fake.requests == []


@pytest.mark.real_model
async def test_fake_serves_embeddings_and_models(fake: FakeOpenAIServer) -> None:
    async with openai.AsyncOpenAI(api_key="x", base_url=fake.base_url, max_retries=0) as client:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake-model"]
        # The SDK asks for base64 by default and decodes it; floats must match that.
        b64 = await client.embeddings.create(model="e", input=["a", "b", "a"])
        floats = await client.embeddings.create(model="e", input="a", encoding_format="float")
        small = await client.embeddings.create(model="e", input="a", dimensions=8)
        plain = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    vectors = [d.embedding for d in b64.data]
    assert len(vectors) == 3 and all(len(v) == 64 for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert vectors[0] == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert sum(x * x for x in vectors[0]) == pytest.approx(1.0, abs=1e-5)
    assert len(small.data[0].embedding) == 8
    assert plain.choices[0].message.content == "echo: hi"
    assert plain.choices[0].finish_reason == "stop"


@pytest.mark.real_model
async def test_a_slow_fake_streams_the_same_answer_in_pieces() -> None:
    # chunk_delay_ms spaces the chunks out (the console's tests watch a reply arrive).
    async with FakeOpenAIServer(chunk_delay_ms=20) as slow:
        model = OpenAIModel("fake-model", base_url=slow.base_url)
        try:
            events = await collect(model, ask("one two three"))
        finally:
            await model.aclose()
    pieces = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(pieces) >= 3
    assert "".join(pieces) == "echo: one two three"
    assert events[-1] == Finish("stop")


async def test_the_transport_is_the_one_asked_for_and_the_server_gets_aiohttp(
    monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    from openai._vendor.httpx_aiohttp import Httpx2AiohttpClient

    import tether.models.openai as module

    def http_client(url: str) -> object:
        return OpenAIModel("fake-model", base_url=url, api_key="x")._get_client()._client

    plain = server.base_url
    with_credentials = plain.replace("http://", "http://someone:secret@", 1)
    monkeypatch.setenv(TRANSPORT_ENV, "aiohttp")
    assert isinstance(http_client(plain), Httpx2AiohttpClient)
    # aiohttp refuses URL credentials beside the SDK's Authorization header: the default.
    assert not isinstance(http_client(with_credentials), Httpx2AiohttpClient)
    monkeypatch.setenv(TRANSPORT_ENV, "httpx")
    assert not isinstance(http_client(plain), Httpx2AiohttpClient)
    # Unset: scripts get the SDK's default, a server (after use_server_transport) aiohttp.
    monkeypatch.delenv(TRANSPORT_ENV)
    assert not isinstance(http_client(plain), Httpx2AiohttpClient)
    monkeypatch.setattr(module, "_server_transport", False)
    module.use_server_transport()
    assert isinstance(http_client(plain), Httpx2AiohttpClient)
    monkeypatch.setenv(TRANSPORT_ENV, "httpx")
    assert not isinstance(http_client(plain), Httpx2AiohttpClient)
    monkeypatch.setenv(TRANSPORT_ENV, "curl")
    with pytest.raises(ConfigError, match="TETHER_OPENAI_TRANSPORT"):
        http_client(plain)
