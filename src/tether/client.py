"""A client for a remote tether server (httpx), sync and async.

Transport failures surface as the builtin ``TimeoutError`` and ``ConnectionError``; HTTP
problems as :class:`RemoteError` (a TetherError, with the problem's ``status``, ``type`` and
``detail``), or as the matching specific error for 404 and 409 (``DecisionMade`` carries the
decision made first).

A turn that waits for a human (DESIGN §3 ``awaiting_input``) is decided with ``on_decision``
(``chat``, ``settle``, ``stream_turn``): a callable (sync or async) given the
:class:`~tether.records.Decision` that answers as :data:`tether.runtime.DecisionAnswer` does —
True/"approve", False/"deny", "always", or a question's answer text. Without one, ``chat`` and
``settle`` raise :class:`~tether.errors.DecisionRequired`; decide with :meth:`Client.decide`
and :meth:`Client.settle` the turn. Decisions and turns rebuilt from the wire have a session
key with an empty tenant and owner (see :mod:`tether._wire`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx

from tether import _wire
from tether._wire import RemoteEvent
from tether.errors import DecisionMade, DecisionRequired, NotFound, RemoteError
from tether.events import TURN_AWAITING_INPUT, TURN_ENDED
from tether.records import Decision, DecisionStatus, Verdict
from tether.runtime import OnDecision

log = logging.getLogger("tether.client")
__all__ = ["AsyncClient", "Client", "RemoteEvent"]

_STREAM_TIMEOUT = httpx.Timeout(None, connect=10.0)
"""A terminal user's stream: a reply may take as long as it takes (the user can Ctrl-C)."""
_REFOLLOW_PAUSE = 0.1
"""Before following a turn again whose stream ended early (its server went away mid-turn)."""
_STOPS = (TURN_AWAITING_INPUT, TURN_ENDED)
"""The events after which a settling client looks at the turn: parked again, or over."""


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
            base_url=base_url.rstrip("/"), timeout=timeout, headers=_wire.headers(api_key, headers)
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"{method} {path} timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
        _wire.raise_for(response)
        return response

    def request(self, method: str, path: str, **kw: Any) -> Any:
        response = self._send(method, path, **kw)
        return response.json() if response.content else None

    def chat(
        self,
        message: str,
        *,
        session_id: str | None = None,
        agent_name: str | None = None,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """``POST /api/chat``: ``{response, agent_name, session_id}``. A turn that waits for a
        decision is decided with ``on_decision`` and followed to its end (DecisionRequired
        without one; TurnFailed if it then does not complete). ``idempotency_key`` goes as the
        ``Idempotency-Key`` header: a retry with it (and ``session_id``) gets the first call's
        turn."""
        body = _wire.chat_body(message, session_id, agent_name)
        headers = _wire.idempotency(idempotency_key)
        response = self._send("POST", "/api/chat", json=body, headers=headers)
        result: dict[str, Any] = response.json()
        if response.status_code != 202:
            return result
        turn = self._settle(result["session_id"], result, on_decision)
        return _wire.chat_reply(result, turn)

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

    def get_turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        """The turn (``TurnOut``); a turn awaiting input lists its pending ``decisions``."""
        turn: dict[str, Any] = self.request("GET", _wire.turn_path(session_id, turn_id))
        return turn

    def decide(
        self,
        session_id: str,
        turn_id: str,
        call_id: str,
        decision: Verdict,
        answer: str | None = None,
    ) -> Decision:
        """Decide what a parked turn asks (approve, deny, always; answer a question); the turn
        goes on. DecisionMade (with the first decision) when it was decided already."""
        made: dict[str, Any] = self.request(
            "POST",
            f"{_wire.turn_path(session_id, turn_id)}/decisions",
            json=_wire.decision_body(call_id, decision, answer),
        )
        return _wire.decision_of(session_id, made)

    def decisions(
        self,
        session_id: str,
        *,
        status: DecisionStatus | None = None,
        turn_id: str | None = None,
    ) -> list[Decision]:
        """The session's decisions (or one turn's), oldest first; ``status="pending"``: what
        waits for a human now."""
        params = {"status": status} if status and not turn_id else None
        listed = self.request("GET", _wire.decisions_path(session_id, turn_id), params=params)
        return _wire.decisions_of(session_id, listed, status)

    def settle(
        self, session_id: str, turn_id: str, *, on_decision: OnDecision | None = None
    ) -> dict[str, Any]:
        """The turn once it has ended (``TurnOut``), deciding on the way what it asks with
        ``on_decision``; DecisionRequired when it waits and there is none."""
        return self._settle(session_id, self.get_turn(session_id, turn_id), on_decision)

    def _settle(
        self, session_id: str, turn: dict[str, Any], on_decision: OnDecision | None
    ) -> dict[str, Any]:
        # ``turn`` is a TurnOut, or /api/chat's 202 (turn_id instead of id).
        turn_id = str(turn.get("id") or turn["turn_id"])
        after = 0
        while not _wire.ended(turn):
            for data in _wire.waiting(turn):
                self._decide_with(session_id, data, on_decision)
            turn, after = self._next_stop(session_id, turn_id, after)
        return turn

    def _decide_with(
        self, session_id: str, data: dict[str, Any], on_decision: OnDecision | None
    ) -> None:
        d = _wire.decision_of(session_id, data)
        verdict, answer = _wire.ask(on_decision, d)
        try:
            self.decide(session_id, d.turn_id, d.call_id, verdict, answer)
        except DecisionMade:
            pass  # decided elsewhere meanwhile: that decision stands
        except RemoteError as exc:
            if exc.status != 400:
                raise
            # The callback's answer does not fit (not one of the choices): refuse rather than
            # leave the turn waiting on a caller who did answer.
            log.warning("on_decision gave %r for %s; refusing", verdict, d.call_id)
            with contextlib.suppress(DecisionMade):
                self.decide(session_id, d.turn_id, d.call_id, "deny")

    def _next_stop(self, session_id: str, turn_id: str, after: int) -> tuple[dict[str, Any], int]:
        """Follow the turn after event ``after`` until it waits for a decision again or ends:
        that turn, and the seq to follow on from."""
        path = f"{_wire.turn_path(session_id, turn_id)}/events"
        for event in self._events("GET", path, params={"after": after}):
            if event.type in _STOPS:
                turn = self.get_turn(session_id, turn_id)
                if _wire.ended(turn) or _wire.waiting(turn):
                    return turn, event.seq
        time.sleep(_REFOLLOW_PAUSE)  # the stream ended early: its server went away
        return self.get_turn(session_id, turn_id), after

    def stream_turn(
        self,
        session_id: str,
        message: str,
        *,
        policy: str = "enqueue",
        on_decision: OnDecision | None = None,
    ) -> Iterator[RemoteEvent]:
        """The turn's events as it runs. With ``on_decision``, each ``decision.requested`` is
        decided once the caller has seen it (a callback that cannot decide leaves it pending:
        the stream waits for someone else). Closing the stream early cancels the turn."""
        body = _wire.stream_body(message, policy)
        path = f"/v1/sessions/{session_id}/turns"
        for event in self._events("POST", path, json=body, timeout=_STREAM_TIMEOUT):
            yield event
            if on_decision is not None and _wire.asks(event):
                with contextlib.suppress(DecisionRequired):
                    self._decide_with(session_id, event.data, on_decision)

    def follow_turn(
        self, session_id: str, turn_id: str, *, after: int = 0
    ) -> Iterator[RemoteEvent]:
        """A turn's events after its event ``after``: those stored, then live to its end (or
        to the server's shutdown). Nothing is decided on the way: see :meth:`decide`."""
        path = f"{_wire.turn_path(session_id, turn_id)}/events"
        yield from self._events("GET", path, params={"after": after}, timeout=_STREAM_TIMEOUT)

    def _events(self, method: str, path: str, **kw: Any) -> Iterator[RemoteEvent]:
        try:
            with self._http.stream(method, path, **kw) as response:
                if response.status_code >= 400:
                    response.read()
                    _wire.raise_for(response)
                parser = _wire.SSEParser()
                for line in response.iter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TimeoutException as exc:
            raise TimeoutError("the turn stream timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc


class AsyncClient:
    """Non-blocking client (the twin of :class:`Client`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=timeout, headers=_wire.headers(api_key, headers)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kw)
        except httpx.TimeoutException as exc:
            raise TimeoutError(f"{method} {path} timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
        _wire.raise_for(response)
        return response

    async def request(self, method: str, path: str, **kw: Any) -> Any:
        response = await self._send(method, path, **kw)
        return response.json() if response.content else None

    async def chat(
        self,
        message: str,
        *,
        session_id: str | None = None,
        agent_name: str | None = None,
        on_decision: OnDecision | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """See :meth:`Client.chat`."""
        body = _wire.chat_body(message, session_id, agent_name)
        headers = _wire.idempotency(idempotency_key)
        response = await self._send("POST", "/api/chat", json=body, headers=headers)
        result: dict[str, Any] = response.json()
        if response.status_code != 202:
            return result
        turn = await self._settle(result["session_id"], result, on_decision)
        return _wire.chat_reply(result, turn)

    async def get_turn(self, session_id: str, turn_id: str) -> dict[str, Any]:
        turn: dict[str, Any] = await self.request("GET", _wire.turn_path(session_id, turn_id))
        return turn

    async def decide(
        self,
        session_id: str,
        turn_id: str,
        call_id: str,
        decision: Verdict,
        answer: str | None = None,
    ) -> Decision:
        """See :meth:`Client.decide`."""
        made: dict[str, Any] = await self.request(
            "POST",
            f"{_wire.turn_path(session_id, turn_id)}/decisions",
            json=_wire.decision_body(call_id, decision, answer),
        )
        return _wire.decision_of(session_id, made)

    async def decisions(
        self,
        session_id: str,
        *,
        status: DecisionStatus | None = None,
        turn_id: str | None = None,
    ) -> list[Decision]:
        params = {"status": status} if status and not turn_id else None
        listed = await self.request("GET", _wire.decisions_path(session_id, turn_id), params=params)
        return _wire.decisions_of(session_id, listed, status)

    async def settle(
        self, session_id: str, turn_id: str, *, on_decision: OnDecision | None = None
    ) -> dict[str, Any]:
        """See :meth:`Client.settle`."""
        turn = await self.get_turn(session_id, turn_id)
        return await self._settle(session_id, turn, on_decision)

    async def _settle(
        self, session_id: str, turn: dict[str, Any], on_decision: OnDecision | None
    ) -> dict[str, Any]:
        turn_id = str(turn.get("id") or turn["turn_id"])
        after = 0
        while not _wire.ended(turn):
            for data in _wire.waiting(turn):
                await self._decide_with(session_id, data, on_decision)
            turn, after = await self._next_stop(session_id, turn_id, after)
        return turn

    async def _decide_with(
        self, session_id: str, data: dict[str, Any], on_decision: OnDecision | None
    ) -> None:
        d = _wire.decision_of(session_id, data)
        verdict, answer = await _wire.aask(on_decision, d)
        try:
            await self.decide(session_id, d.turn_id, d.call_id, verdict, answer)
        except DecisionMade:
            pass  # decided elsewhere meanwhile: that decision stands
        except RemoteError as exc:
            if exc.status != 400:
                raise
            log.warning("on_decision gave %r for %s; refusing", verdict, d.call_id)
            with contextlib.suppress(DecisionMade):
                await self.decide(session_id, d.turn_id, d.call_id, "deny")

    async def _next_stop(
        self, session_id: str, turn_id: str, after: int
    ) -> tuple[dict[str, Any], int]:
        path = f"{_wire.turn_path(session_id, turn_id)}/events"
        async for event in self._events("GET", path, params={"after": after}):
            if event.type in _STOPS:
                turn = await self.get_turn(session_id, turn_id)
                if _wire.ended(turn) or _wire.waiting(turn):
                    return turn, event.seq
        await asyncio.sleep(_REFOLLOW_PAUSE)
        return await self.get_turn(session_id, turn_id), after

    async def stream_turn(
        self,
        session_id: str,
        message: str,
        *,
        policy: str = "enqueue",
        on_decision: OnDecision | None = None,
    ) -> AsyncIterator[RemoteEvent]:
        """See :meth:`Client.stream_turn`."""
        body = _wire.stream_body(message, policy)
        path = f"/v1/sessions/{session_id}/turns"
        async for event in self._events("POST", path, json=body, timeout=_STREAM_TIMEOUT):
            yield event
            if on_decision is not None and _wire.asks(event):
                with contextlib.suppress(DecisionRequired):
                    await self._decide_with(session_id, event.data, on_decision)

    async def _events(self, method: str, path: str, **kw: Any) -> AsyncIterator[RemoteEvent]:
        try:
            async with self._http.stream(method, path, **kw) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _wire.raise_for(response)
                parser = _wire.SSEParser()
                async for line in response.aiter_lines():
                    event = parser.feed(line)
                    if event is not None:
                        yield event
        except httpx.TimeoutException as exc:
            raise TimeoutError("the turn stream timed out") from exc
        except httpx.TransportError as exc:
            raise ConnectionError(f"cannot reach the tether server: {exc}") from exc
