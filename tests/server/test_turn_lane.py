"""The turn route's lane past FastAPI (``tether.server.turn_lane``): it serves the plain turn
requests itself, passes every other request on with its body intact, and answers exactly
what the FastAPI route answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from tether.agent import Agent
from tether.server.app import create_app
from tether.server.settings import Limits, Settings
from tether.server.turn_lane import TurnLane
from tether.testing import ScriptedModel

LIMITS = Limits(max_message_chars=100, max_body_bytes=2_000)
TURNS = "/v1/sessions/s1/turns"


def answer(request: Any) -> str:
    return f"you said {request.messages[-1].content}"


@dataclass
class Passed:
    """What reached FastAPI's routing from the lane: each request's path and body."""

    app: ASGIApp
    seen: list[tuple[str, str, bytes]] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        sent = False

        async def again() -> Any:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        self.seen.append((scope["method"], scope["path"], body))
        await self.app(scope, again, send)


def the_lane(app: FastAPI) -> TurnLane:
    layer: Any = app.middleware_stack
    while not isinstance(layer, TurnLane):
        layer = layer.app
    return layer


@asynccontextmanager
async def serving(
    data_dir: Path, *, lane: bool = True, client: tuple[str, int] = ("127.0.0.1", 40000)
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    app = create_app(
        Settings(data_dir=data_dir, limits=LIMITS),
        agents=[Agent(name="a", model=ScriptedModel(default=answer))],
    )
    if not lane:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not TurnLane]  # type: ignore[comparison-overlap]
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            if client[0] == "127.0.0.1":  # a caller from elsewhere may not make one
                r = await c.post("/v1/sessions", json={"session_id": "s1"})
                assert r.status_code == 201, r.text
            yield c, app


@asynccontextmanager
async def spied(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Passed]]:
    """The app, with what the lane passes on to FastAPI's routing recorded (in the same task:
    the lifespan's cancel scopes must be left where they were entered)."""
    async with serving(tmp_path) as (c, app):
        lane = the_lane(app)  # built by the first request
        passed = Passed(lane.app)
        lane.app = passed
        yield c, passed


async def test_a_plain_turn_is_served_by_the_lane(
    tmp_path: Path,
) -> None:
    async with spied(tmp_path) as (c, passed):
        for body in (
            {"input": "hello"},
            {"input": "again", "policy": "enqueue", "on_disconnect": "cancel", "wait": True},
        ):
            r = await c.post(TURNS, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["output"] == f"you said {body['input']}"
        r = await c.post(
            TURNS, content=b'{"input": "charset"}', headers=json_type("; charset=utf-8")
        )
        assert r.status_code == 200, r.text
        assert passed.seen == []  # FastAPI's routing saw none of them
        # The turns are the session's, in order, as the route would have kept them.
        listed = (await c.get(TURNS)).json()["data"]
        assert [t["input"] for t in listed] == ["hello", "again", "charset"]
        assert passed.seen == [("GET", TURNS, b"")]


def json_type(params: str = "") -> dict[str, str]:
    return {"content-type": f"application/json{params}"}


@pytest.mark.parametrize(
    ("content", "headers", "status"),
    [
        # The route's own answers to what the lane does not read, the body intact.
        (b'{"input": ""}', json_type(), 422),
        (b'{"input": "hi", "wait": "yes"}', json_type(), 422),
        (b'{"input": "hi"', json_type(), 400),
        (b"[1, 2]", json_type(), 422),
        (b"", json_type(), 422),
        (b"\xff\xfe", json_type(), 400),
        (b'{"input": "hi"}', {"content-type": "text/plain"}, 422),
        (b'{"input": "hi"}', {"content-type": "application/vnd.api+json"}, 200),
        (b'{"input": "hi"}', {}, 422),
        # Turns the route reads and runs: their bodies reached it whole.
        (b'{"input": "keyed"}', {**json_type(), "Idempotency-Key": "k-1"}, 200),
        (b'{"input": "' + b"{" * 65 + b'"}', json_type(), 200),
        # Nested (then dropped by the later key): how deep json.loads goes depends on how deep
        # the stack is, and the route parses further down than the lane.
        (
            b'{"agent": ' + b"[" * 100 + b"]" * 100 + b', "agent": null, "input": "deep"}',
            json_type(),
            200,
        ),
        (b'{"input": "hi"}', {**json_type(), "Idempotency-Key": "bad key"}, 422),
    ],
)
async def test_what_the_lane_does_not_read_goes_to_the_route_whole(
    tmp_path: Path,
    content: bytes,
    headers: dict[str, str],
    status: int,
) -> None:
    async with spied(tmp_path) as (c, passed):
        r = await c.post(TURNS, content=content, headers=headers)
        assert r.status_code == status, r.text
        assert passed.seen == [("POST", TURNS, content)]
        if status == 200:
            assert r.json()["output"].startswith("you said ")


async def test_other_methods_and_paths_go_to_the_route(
    tmp_path: Path,
) -> None:
    async with spied(tmp_path) as (c, passed):
        body = b'{"input": "hi"}'
        assert (await c.post(TURNS + "/", content=body, headers=json_type())).status_code != 200
        assert (await c.put(TURNS, content=body, headers=json_type())).status_code == 405
        assert (await c.post("/v1/sessions/s1/turnsx", content=body)).status_code == 404
        assert [(m, p) for m, p, _ in passed.seen] == [
            ("POST", TURNS + "/"),
            ("PUT", TURNS),
            ("POST", "/v1/sessions/s1/turnsx"),
        ]


async def test_a_request_fastapi_traces_goes_to_the_route(tmp_path: Path) -> None:
    """FastAPI's own telemetry (when configured) marks the scope; the route then names the
    span and records its parts, which the lane would not."""
    async with spied(tmp_path) as (c, passed):
        app = c._transport.app  # type: ignore[attr-defined]

        async def traced(scope: Scope, receive: Receive, send: Send) -> None:
            await app({**scope, "fastapi.telemetry": object()}, receive, send)

        transport = httpx.ASGITransport(app=traced, client=("127.0.0.1", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as t:
            r = await t.post(TURNS, json={"input": "traced"})
        assert r.status_code == 200, r.text
        assert passed.seen == [("POST", TURNS, b'{"input":"traced"}')]


async def test_a_body_over_the_limit_is_refused_on_the_lane(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path) as (c, _):

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: BodyLimit counts
            yield b'{"input": "'
            for _ in range(30):
                yield b"x" * 100
            yield b'"}'

        r = await c.post(TURNS, content=chunks(), headers=json_type())
        assert r.status_code == 413
        assert r.json()["type"].endswith("too-large")
        assert (await c.get(TURNS)).json()["data"] == []  # nothing was written


# What the route answers, request by request; the lane must answer the same.
SCENARIOS: list[tuple[str, dict[str, Any]]] = [
    ("a turn", {"json": {"input": "hello"}}),
    ("a second turn sees the first", {"json": {"input": "again"}}),
    ("an unknown session", {"url": "/v1/sessions/nobody/turns", "json": {"input": "hi"}}),
    ("a bad session id", {"url": "/v1/sessions/bad%20id!/turns", "json": {"input": "hi"}}),
    ("a message over the limit", {"json": {"input": "x" * 101}}),
    ("a NUL", {"json": {"input": "a\u0000b"}}),
    ("an agent not served", {"json": {"input": "hi", "agent": "zed"}}),
    ("fire and forget", {"json": {"input": "later", "wait": False}}),
    ("a conflicting key", {"json": {"input": "hi", "idempotency_key": "a"}, "key": "b"}),
    ("another host", {"json": {"input": "hi"}, "headers": {"host": "evil.example"}}),
    ("another origin", {"json": {"input": "hi"}, "headers": {"origin": "https://evil.example"}}),
    ("a malformed bearer", {"json": {"input": "hi"}, "headers": {"authorization": "Basic x"}}),
    ("an unknown key", {"json": {"input": "hi"}, "headers": {"authorization": "Bearer nope"}}),
    ("two keys", {"json": {"input": "hi"}, "auth2": True}),
]
VOLATILE = {"id", "created_at", "started_at", "ended_at", "turn_id"}


def comparable(r: httpx.Response) -> tuple[int, str, Any, str | None]:
    body: Any = r.json() if r.content else None
    if isinstance(body, dict):
        body = {k: v for k, v in body.items() if k not in VOLATILE}
    location = r.headers.get("location")
    return r.status_code, r.headers.get("content-type", ""), body, location and "set"


async def answers(c: httpx.AsyncClient) -> list[tuple[int, str, Any, str | None]]:
    out = []
    for _, case in SCENARIOS:
        headers = dict(case.get("headers", {}))
        if "key" in case:
            headers["Idempotency-Key"] = case["key"]
        if case.get("auth2"):
            headers_list = [("authorization", "Bearer a"), ("authorization", "Bearer b")]
            r = await c.post(TURNS, json=case["json"], headers=headers_list)
        else:
            r = await c.post(case.get("url", TURNS), json=case["json"], headers=headers)
        out.append(comparable(r))
    return out


async def test_the_lane_answers_what_the_route_answers(tmp_path: Path) -> None:
    async with serving(tmp_path / "lane") as (c, _):
        with_lane = await answers(c)
    async with serving(tmp_path / "route", lane=False) as (c, app):
        assert not any(isinstance(m, TurnLane) for m in _stack(app))
        by_route = await answers(c)
    for (name, _), ours, theirs in zip(SCENARIOS, with_lane, by_route, strict=True):
        assert ours == theirs, name
    statuses = {name: ours[0] for (name, _), ours in zip(SCENARIOS, with_lane, strict=True)}
    assert statuses["a turn"] == 200
    assert statuses["an unknown session"] == 404
    assert statuses["fire and forget"] == 202
    assert {statuses["another host"], statuses["another origin"]} == {403}


async def test_a_caller_from_elsewhere_gets_the_routes_401(tmp_path: Path) -> None:
    far = ("10.1.2.3", 40000)
    async with serving(tmp_path / "lane", client=far) as (c, _):
        ours = comparable(await c.post(TURNS, json={"input": "hi"}))
    async with serving(tmp_path / "route", lane=False, client=far) as (c, _):
        theirs = comparable(await c.post(TURNS, json={"input": "hi"}))
    assert ours == theirs
    assert ours[0] == 401


def _stack(app: FastAPI) -> list[Any]:
    layers, layer = [], app.middleware_stack
    while layer is not None:
        layers.append(layer)
        layer = getattr(layer, "app", None)
    return layers
