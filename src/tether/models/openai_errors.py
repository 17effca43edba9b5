"""What an OpenAI SDK error means, in the few words of ours a caller gets.

A ModelError's text reaches callers (turn records, ``turn.ended``, error bodies), so it is a
short sentence of ours; the upstream's own words and the exception's text are the detail, for
the log only (see :mod:`tether.models.openai`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import openai

# 408 and 409 are retried too: OpenAI documents both as safe to retry (timeouts, lock conflicts).
_TRANSIENT_STATUSES = frozenset({408, 409, 429})
_MAX_LOGGED = 2000
# What a status means, in the few words a caller gets instead of the upstream's body.
_STATUS_HINTS = {
    400: "request refused",
    401: "key refused",
    403: "key refused",
    404: "unknown model or endpoint",
    408: "timed out",
    409: "conflict",
    413: "request too large",
    422: "request refused",
    429: "rate limited",
}


@dataclass(frozen=True, slots=True)
class Explained:
    what: str
    """Ours, for callers."""
    detail: BaseException | str | None
    """For the log only."""
    transient: bool = True
    status: int | None = None


def explain(exc: openai.OpenAIError, timeout: float) -> Explained:
    """A retry-classified account of an SDK exception; never a traceback."""
    if isinstance(exc, openai.APITimeoutError) and not connection_failed(exc):
        return Explained(f"the model provider did not answer within {timeout:g}s", exc.__cause__)
    if isinstance(exc, openai.APIConnectionError):
        # The SDK's own message is a bare "Connection error."; the transport cause says why.
        return Explained("the model provider could not be reached", exc.__cause__ or exc)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        hint = _STATUS_HINTS.get(status, "server error" if status >= 500 else "refused")
        return Explained(
            f"the model provider answered HTTP {status} ({hint})",
            server_message(exc),
            transient=status >= 500 or status in _TRANSIENT_STATUSES,
            status=status,
        )
    if isinstance(exc, openai.APIError):
        # An error event inside an accepted stream: the server failed mid-answer.
        return Explained("the model provider failed mid-answer", exc.message)
    return Explained("the model provider request failed", exc, transient=False)


def connection_failed(exc: BaseException) -> bool:
    """Whether what the SDK calls a timeout was a connection that failed: refused, reset, or
    closed by the server before it answered (httpx's transport says so itself).

    The SDK's aiohttp transport maps every ``aiohttp.ClientConnectionError`` to
    ``httpx.ConnectTimeout``; the aiohttp error is still in the chain, and a real timeout is a
    ``ServerTimeoutError`` (or a plain ``TimeoutError``) there.
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    failed = False
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, aiohttp.ServerTimeoutError | TimeoutError):
            return False
        if isinstance(link, aiohttp.ClientConnectionError):
            failed = True
        link = link.__cause__ or link.__context__
    return failed


def server_message(exc: openai.APIStatusError) -> str:
    # The SDK's message embeds the whole body ("Error code: 500 - {...}"); prefer the server's
    # own error.message, which the SDK unwraps into ``body``.
    body: Any = exc.body
    if isinstance(body, dict):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    if isinstance(body, str) and body:
        return body
    return exc.response.reason_phrase or exc.message


def clip(text: str) -> str:
    """``text`` on one line, at most _MAX_LOGGED characters (for the log)."""
    text = " ".join(text.split())
    return text if len(text) <= _MAX_LOGGED else text[: _MAX_LOGGED - 1] + "…"
