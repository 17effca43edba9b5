"""Sending one chat completions request: the SDK's client and errors, not its per-request work.

``client.post`` runs, for every request, a pipeline made for every endpoint and every way of
authenticating: the request's options copied twice (pydantic models), the headers merged and
validated anew, the URL joined and parsed again, the hooks of provider runtimes and workload
identity, a retry loop (ours is off). In ``tether serve`` (64 sessions, 0 ms fake model) a
turn cost 1.50 ms of CPU through it and 1.34 ms without it; one session at a time, 3.80 and
3.52 ms (2026-12-07, A/B in one run on this 2-core host, bench/README.md).

What tether sends never varies but for its body: one URL, one set of headers. So both are
worked out once per client, from the SDK's own (``base_url``, ``auth_headers``,
``default_headers``, and the two ``X-Stainless-*`` headers it adds to each request), and every
request goes through the SDK's HTTP client (``openai.DefaultAioHttpClient`` or
``openai.DefaultAsyncHttpxClient``: its transport, pool, redirects, cookies and timeouts). A
failure leaves as the exception ``client.post`` raises for it (``APITimeoutError``,
``APIConnectionError``, the ``APIStatusError`` the SDK makes of the response), so
:mod:`.openai_errors` reads both paths the same. The upstream sees the request the SDK would
have sent (tests/models/test_openai.py compares them).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
import openai

__all__ = ["Route", "route", "send"]

# The SDK's own classification (openai._httpx2.request_exceptions): a request that failed
# before any response, whose transport said why.
_REQUEST_ERRORS = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)


@dataclass(frozen=True, slots=True)
class Route:
    """Where and how one SDK client's chat requests go, worked out once."""

    client: openai.AsyncOpenAI
    http: httpx2.AsyncClient
    url: httpx2.URL
    headers: httpx2.Headers
    """The HTTP client's own headers with the SDK's over them, as ``build_request`` merges them
    for each request (ours never change after the client is made)."""
    extensions: dict[str, Any]


async def route(client: openai.AsyncOpenAI, http: httpx2.AsyncClient, seconds: float) -> Route:
    """The route of ``client``'s chat requests, sent on ``http`` (the client's HTTP client)
    with a timeout of ``seconds``."""
    # The headers name the platform, which the SDK reads off the event loop (it may read
    # files) and caches; read here first in a thread, only a first client waits for it. The
    # rest are read on the loop: one names the async library it runs on.
    await asyncio.to_thread(client.platform_headers)
    headers = httpx2.Headers(http.headers)
    headers.update(_headers(client, seconds))
    # The SDK's join (_prepare_url): the base's raw path and ours, end to end. Not RFC 3986's
    # (httpx2.URL.join), which would drop a query string the base URL carries.
    base = client.base_url
    url = base.copy_with(raw_path=base.raw_path + b"chat/completions")
    return Route(client, http, url, headers, {"timeout": httpx2.Timeout(seconds).as_dict()})


def _headers(client: openai.AsyncOpenAI, timeout: float) -> dict[str, str]:
    """The SDK's headers for a request, merged as it merges them: a later source wins whatever
    the case of its names (custom headers, often written in lower case, replace the SDK's own:
    a gateway's ``authorization`` must not go out beside the key), and an Omit removes."""
    merged: dict[str, tuple[str, str]] = {}
    for source in (client.auth_headers, client.default_headers):
        for name, value in source.items():
            if isinstance(value, str):
                merged[name.lower()] = (name, value)
            else:  # the SDK's Omit: send no such header
                merged.pop(name.lower(), None)
    # What the SDK sets on each request over those (only a request's own headers, which
    # tether gives none, keep theirs): tether's retries are its own, so the SDK's count is 0.
    merged["x-stainless-retry-count"] = ("x-stainless-retry-count", "0")
    merged["x-stainless-read-timeout"] = ("x-stainless-read-timeout", str(timeout))
    return dict(merged.values())


async def send(route: Route, body: bytes) -> httpx2.Response:
    """POST ``body`` (JSON) and return the response, its body not yet read; a response that is
    not a success is read, closed, and raised as the SDK's ``APIStatusError``."""
    http = route.http
    # What http.build_request makes, without merging the same headers again each time; the
    # cookies are the client's as they are now (a response may have set some).
    request = httpx2.Request(
        "POST",
        route.url,
        headers=route.headers,
        cookies=http.cookies,
        content=body,
        extensions=route.extensions,
    )
    try:
        response = await http.send(request, stream=True)
    except httpx2.TimeoutException as exc:
        raise openai.APITimeoutError(request=request) from exc
    except _REQUEST_ERRORS as exc:
        raise openai.APIConnectionError(request=request) from exc
    if response.is_success:
        return response
    try:
        await response.aread()
    except _REQUEST_ERRORS as exc:
        raise openai.APIConnectionError(request=request) from exc
    finally:
        await response.aclose()
    # The SDK's own reading of an error body (its message, the status's exception class).
    raise route.client._make_status_error_from_response(response)
