"""A client for a remote tether server (httpx), sync and async.

Transport failures surface as the builtin ``TimeoutError`` and ``ConnectionError``; HTTP
problems as :class:`RemoteError` (a TetherError, with the problem's ``status``, ``type`` and
``detail``), or as the matching specific error for 404 and 409.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from tether.errors import AgentNotFound, NotFound, RemoteError, SessionBusy


@dataclass(frozen=True, slots=True)
class RemoteEvent:
    id: str
    type: str
    data: dict[str, Any]


def _raise_for(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text[:200]}
    if not isinstance(body, dict):
        body = {"detail": str(body)[:200]}
    detail = str(body.get("detail", response.reason_phrase))
    if response.status_code == 404:
        if isinstance(body.get("agents"), list):  # only an unknown agent's 404 lists them
            raise AgentNotFound(detail, known=[str(a) for a in body["agents"]])
        raise NotFound(detail)
    if response.status_code == 409 and body.get("busy_turn_id"):
        raise SessionBusy(detail, busy_turn_id=str(body["busy_turn_id"]))
    raise RemoteError(response.status_code, str(body.get("type", "")), detail, body)


def _headers(api_key: str | None, extra: dict[str, str] | None) -> dict[str, str]:
    headers = dict(extra or {})
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


# The sync and async clients are twins over these I/O-free pieces.
def _chat_body(message: str, session_id: str | None, agent_name: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"message": message}
    if session_id:
        body["session_id"] = session_id
    if agent_name:
        body["agent_name"] = agent_name
    return body


def _stream_body(message: str, policy: str) -> dict[str, Any]:
    # Closing the stream early cancels the turn: a terminal user pressing Ctrl-C means it.
    return {"input": message, "stream": True, "policy": policy, "on_disconnect": "cancel"}


class _SSEParser:
    """Incremental: feed lines, get an event at each blank line (sync and async share it)."""

    def __init__(self) -> None:
        self._id, self._type, self._data = "", "message", list[str]()

    def feed(self, line: str) -> RemoteEvent | None:
        if line == "":
            event = None
            if self._data:
                event = RemoteEvent(self._id, self._type, json.loads("\n".join(self._data)))
            self._id, self._type, self._data = "", "message", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "id":
            self._id = value
        elif name == "event":
            self._type = value
        elif name == "data":
            self._data.append(value)
        return None


class Client:
    """Blocking client."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout, headers=_headers(api_key, headers)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"{method} {path} timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
        _raise_for(response)
        return response.json() if response.content else None

    def chat(
        self, message: str, *, session_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        body = _chat_body(message, session_id, agent_name)
        result: dict[str, Any] = self.request("POST", "/api/chat", json=body)
        return result

    def ensure_session(self, session_id: str | None, agent: str | None) -> dict[str, Any]:
        if session_id:
            try:
                found: dict[str, Any] = self.request("GET", f"/v1/sessions/{session_id}")
                return found
            except NotFound:
                pass
        body: dict[str, Any] = {"session_id": session_id} if session_id else {}
        if agent:
            body["agent"] = agent
        created: dict[str, Any] = self.request("POST", "/v1/sessions", json=body)
        return created

    def decide(self, session_id: str, turn_id: str, call_id: str, approve: bool) -> bool:
        """Approve or refuse a call the turn waits on; False when it was not waiting any more."""
        result: dict[str, Any] = self.request(
            "POST",
            f"/v1/sessions/{session_id}/turns/{turn_id}/decisions",
            json={"call_id": call_id, "approve": approve},
        )
        return bool(result["accepted"])

    def stream_turn(
        self, session_id: str, message: str, *, policy: str = "enqueue"
    ) -> Iterator[RemoteEvent]:
        body = _stream_body(message, policy)
        try:
            with self._http.stream(
                "POST",
                f"/v1/sessions/{session_id}/turns",
                json=body,
                timeout=httpx.Timeout(None, connect=10.0),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for(response)
                parser = _SSEParser()
                for line in response.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TimeoutException as exc:
            raise TimeoutError("the turn stream timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc


class AsyncClient:
    """Non-blocking client."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=timeout, headers=_headers(api_key, headers)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"{method} {path} timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
        _raise_for(response)
        return response.json() if response.content else None

    async def chat(
        self, message: str, *, session_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        body = _chat_body(message, session_id, agent_name)
        result: dict[str, Any] = await self.request("POST", "/api/chat", json=body)
        return result

    async def decide(self, session_id: str, turn_id: str, call_id: str, approve: bool) -> bool:
        """Approve or refuse a call the turn waits on; False when it was not waiting any more."""
        result: dict[str, Any] = await self.request(
            "POST",
            f"/v1/sessions/{session_id}/turns/{turn_id}/decisions",
            json={"call_id": call_id, "approve": approve},
        )
        return bool(result["accepted"])

    async def stream_turn(
        self, session_id: str, message: str, *, policy: str = "enqueue"
    ) -> AsyncIterator[RemoteEvent]:
        body = _stream_body(message, policy)
        try:
            async with self._http.stream(
                "POST",
                f"/v1/sessions/{session_id}/turns",
                json=body,
                timeout=httpx.Timeout(None, connect=10.0),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _raise_for(response)
                parser = _SSEParser()
                async for line in response.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TimeoutException as exc:
            raise TimeoutError("the turn stream timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
