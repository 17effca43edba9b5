"""The ``openai`` provider: any OpenAI-compatible chat completions endpoint (OpenAI, Ollama, ...).

The SDK's own retries are off (``max_retries=0``): tether's turn loop owns the retry policy, and
two retry layers would multiply attempts and hide failures. Every SDK error leaves this module as a
:class:`~tether.errors.ModelError` whose ``transient`` flag tells the loop whether to retry.

A ModelError's text reaches callers (turn records, ``turn.ended``, error bodies), so it is a
short sentence of ours: never the base URL (it may carry credentials), the upstream's own words
(a proxy may quote the request's ``Authorization`` back) or an exception's text. Those go to
this module's log, with any password in the URL and the API key itself masked.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai
import orjson

from tether.errors import ConfigError, ModelError
from tether.models.base import (
    Finish,
    ModelEvent,
    ModelRequest,
)
from tether.models.guard import ensure_requests_allowed
from tether.models.openai_errors import clip, explain
from tether.models.openai_messages import Encoded
from tether.models.openai_send import Route, route, send
from tether.models.openai_stream import Answer, body_of, reads
from tether.redact import redact_url

__all__ = ["OPENAI_BASE_URL", "OpenAIModel"]

log = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"

TRANSPORT_ENV = "TETHER_OPENAI_TRANSPORT"
"""``aiohttp`` or ``httpx``: the HTTP transport of every OpenAI client, whoever runs it."""
_server_transport = False


def use_server_transport() -> None:
    """Give the clients made from now on the SDK's aiohttp transport (the server calls this).

    A streamed answer arrives as many small chunks, and the SDK's default transport (httpx2 and
    httpcore2 over anyio) spends more CPU on each than everything else a turn does together;
    with aiohttp a turn cost 38 % less server CPU (tether serve, 64 sessions, 0 ms fake
    model). Requests, retries, errors and response types stay the SDK's. Only a server,
    whose one event loop lives as long as the process and closes its models at shutdown, gets
    it by default: an aiohttp session left behind on another loop (a script's second
    ``asyncio.run``) cannot be closed there, and aiohttp complains of it on stderr when it is
    collected.
    """
    global _server_transport
    _server_transport = True


def transport_asked() -> str:
    """``TETHER_OPENAI_TRANSPORT`` (``aiohttp``, ``httpx``, or empty); ConfigError otherwise."""
    asked = os.environ.get(TRANSPORT_ENV, "").strip().lower()
    if asked not in ("", "aiohttp", "httpx"):
        raise ConfigError(f"{TRANSPORT_ENV} must be 'aiohttp' or 'httpx', not {asked!r}")
    return asked


def _http_client(base_url: str, timeout: float) -> httpx2.AsyncClient:
    """The SDK's aiohttp transport (``openai.DefaultAioHttpClient``) or its default one
    (``openai.DefaultAsyncHttpxClient``, what the SDK makes when given none).

    aiohttp refuses credentials in the URL beside the SDK's Authorization header, so such a
    base URL keeps the default transport.
    """
    asked = transport_asked()
    wanted = asked == "aiohttp" or (asked == "" and _server_transport)
    parts = urlsplit(base_url)
    if not wanted or parts.username is not None or parts.password is not None:
        return openai.DefaultAsyncHttpxClient(timeout=timeout)
    return openai.DefaultAioHttpClient(timeout=timeout)


def _checked_base_url(url: str) -> str:
    """``url`` if requests can be sent to it: an http(s) URL with a host and a port that can
    be one. Otherwise a ConfigError at once, not a turn that fails as if the server were down
    (and is tried again) or an exception of the HTTP client's that is no ModelError."""
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - it raises ValueError for a port out of range
    except ValueError:
        raise ConfigError(f"the OpenAI base URL has an invalid port: {redact_url(url)!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"the OpenAI base URL must be an http:// or https:// URL with a host, "
            f"not {redact_url(url)!r}"
        )
    return url


class OpenAIModel:
    """A chat model behind an OpenAI-compatible ``/chat/completions`` endpoint."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        label: str | None = None,
        timeout: float = 60.0,
        context_window: int = 128_000,
    ) -> None:
        env_base_url = os.environ.get("OPENAI_BASE_URL") or None
        custom_base_url = base_url or env_base_url
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None:
            if custom_base_url is None:
                raise ConfigError(
                    f"model 'openai:{model}' needs an API key: set OPENAI_API_KEY, or set "
                    "OPENAI_BASE_URL to a local OpenAI-compatible server that needs none"
                )
            # Local servers (Ollama, llama.cpp, vLLM) ignore the key, but the SDK insists on one.
            key = "not-needed"
        self.model = model
        self.base_url = _checked_base_url((custom_base_url or OPENAI_BASE_URL).rstrip("/"))
        self.timeout = timeout
        self._api_key = key
        self._name = label or f"openai:{model}"
        self._context_window = context_window
        # OpenAI itself wants max_completion_tokens (reasoning models reject max_tokens), while
        # compatible servers have long understood only max_tokens.
        self._official = custom_base_url is None
        self._bound: _Bound | None = None
        self._encoded = Encoded()

    @property
    def name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int:
        return self._context_window

    def __repr__(self) -> str:
        return f"OpenAIModel({self.model!r}, base_url={self.base_url!r}, label={self._name!r})"

    @property
    def _client(self) -> openai.AsyncOpenAI | None:
        """The SDK client of the loop that last used this model, if it is still open."""
        return self._bound.client if self._bound is not None else None

    def _bind(self) -> _Bound:
        # The client's connection pool is bound to the event loop it first ran on; an instance is
        # shared process-wide (resolve_model), so a new loop (e.g. a later asyncio.run) gets a new
        # client instead of pooled connections from a dead loop.
        loop = asyncio.get_running_loop()
        bound = self._bound
        if bound is None or bound.loop is not loop:
            # The HTTP client is ours to name, so that requests can go on it (openai_send).
            http = _http_client(self.base_url, self.timeout)
            client = openai.AsyncOpenAI(
                api_key=self._api_key,
                base_url=self.base_url,
                timeout=self.timeout,
                max_retries=0,
                http_client=http,
            )
            bound = self._bound = _Bound(loop, client, http)
        return bound

    def _get_client(self) -> openai.AsyncOpenAI:
        return self._bind().client

    async def _get_route(self) -> Route:
        """Where this loop's client sends chat requests (see :mod:`.openai_send`)."""
        while True:
            bound = self._bind()
            if bound.route is not None:
                return bound.route
            made = await route(bound.client, bound.http, self.timeout)
            if self._bound is bound:
                bound.route = made
                return made
            # Closed (aclose) while the route was worked out: a new client serves this call.

    async def aclose(self) -> None:
        """Close the HTTP client and its pooled connections; the next ``stream`` opens a new one.

        Only a client of the running loop can be closed here; one of another loop is left to
        that loop (a runtime closes its models on its own loop when it closes)."""
        bound = self._bound
        if bound is None or bound.loop is not asyncio.get_running_loop():
            return
        self._bound = None
        await bound.client.close()

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": self._encoded.array(request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        limit = request.max_output_tokens
        if limit is not None:
            body["max_completion_tokens" if self._official else "max_tokens"] = limit
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelEvent]:
        ensure_requests_allowed(self._name)
        # The SDK's client, headers, HTTP and errors, without its per-request pipeline
        # (openai_send). The body goes as bytes orjson wrote (the SDK's json.dumps took ~20x as
        # long on a long history), and the chunks are read as plain JSON with orjson too:
        # the SDK's per-chunk model objects cost several ms of CPU a turn.
        try:
            response = await send(await self._get_route(), orjson.dumps(self._body(request)))
        except openai.OpenAIError as exc:
            raise self._error(exc) from exc

        answer = Answer(self._failed)
        try:
            async for lines in reads(body_of(response)):
                events, error = answer.read(lines)
                for event in events:
                    yield event
                if error is not None:
                    raise error
            error = answer.end()
            if error is not None:
                raise error
        except httpx2.TimeoutException as exc:
            raise self._failed("the model provider's stream timed out", exc) from exc
        except httpx2.TransportError as exc:
            raise self._failed(
                "the connection to the model provider broke mid-answer", exc
            ) from exc
        except httpx2.RequestError as exc:  # a body its encoding cannot decode, say
            raise self._failed("the model provider's answer could not be read", exc) from exc
        finally:
            # However the generator ends (exhausted, failed, closed by a consumer that stopped
            # iterating), the response is closed and its connection released.
            await response.aclose()
        usage, finish = answer.usage, answer.finish
        if finish is None:
            # A stream that stops without a finish_reason was cut (proxy, server crash, dropped
            # connection): the answer is incomplete, and asking again may well work.
            raise self._failed("the model provider's stream ended before a finish reason")
        # The usage chunk comes after the finish chunk; Finish is always the last event.
        if usage is not None:
            yield usage
        yield Finish(finish)

    def _failed(
        self,
        what: str,
        detail: BaseException | str | None = None,
        *,
        transient: bool = True,
        status: int | None = None,
    ) -> ModelError:
        """A ModelError saying ``what`` (ours, for callers); ``detail`` goes to the log only."""
        if isinstance(detail, BaseException):
            detail = f"{type(detail).__name__}: {detail}"
        log.warning(
            "%s: %s (%s): %s",
            self._name,
            what,
            redact_url(self.base_url),
            self._scrub(detail) if detail else "no detail",
        )
        return ModelError(f"{self._name}: {what}", transient=transient, status=status)

    def _scrub(self, text: str) -> str:
        # Upstreams (and proxies) may quote the request back: never log the key itself.
        if len(self._api_key) >= 8:
            text = text.replace(self._api_key, "***")
        return clip(redact_url(text))

    def _error(self, exc: openai.OpenAIError) -> ModelError:
        """A short, retry-classified ModelError for an SDK exception; never a traceback."""
        e = explain(exc, self.timeout)
        return self._failed(e.what, e.detail, transient=e.transient, status=e.status)


@dataclass(slots=True)
class _Bound:
    """One event loop's clients: the SDK's, the HTTP client it was given, the route once known."""

    loop: asyncio.AbstractEventLoop
    client: openai.AsyncOpenAI
    http: httpx2.AsyncClient
    route: Route | None = None
