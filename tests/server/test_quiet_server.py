"""The uvicorn server tether runs: no tenth-of-a-second tick, and it stops as soon as asked."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn

from tests.helpers import wait_until
from tether.server import quiet
from tether.server.quiet import QuietServer


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _server() -> tuple[QuietServer, socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, lifespan="off", log_level="warning")
    return QuietServer(config), sock


def _ticks(server: QuietServer) -> list[float]:
    """When the server's ticks come, from now on."""
    ticks: list[float] = []
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(time.monotonic())
        return await on_tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    return ticks


async def test_a_server_with_nothing_to_do_ticks_once_a_second_not_ten_times() -> None:
    server, sock = _server()
    ticks = _ticks(server)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    await asyncio.sleep(2.5)
    server.should_exit = True
    await asyncio.wait_for(serving, 10)
    # uvicorn's own loop ticks every 0.1 s: ~25 times in this window.
    assert 2 <= len(ticks) <= 5, ticks


async def test_the_date_header_is_renewed_on_every_tick() -> None:
    server, sock = _server()
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    port = sock.getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as c:
            await wait_until(lambda: server.started)
            first = (await c.get("/")).headers["date"]
            await asyncio.sleep(2.2)
            later = (await c.get("/")).headers["date"]
        assert later != first  # a header to the second, two seconds later
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


@pytest.mark.parametrize("where", ["loop", "thread"])
async def test_setting_should_exit_stops_the_server_at_once_not_at_the_next_tick(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quiet, "TICK", 1000.0)  # no tick comes within the test's timeout
    server, sock = _server()
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    await wait_until(lambda: server.started)
    await asyncio.sleep(0.2)  # main_loop waits now
    if where == "loop":
        server.should_exit = True
    else:
        # As a test or an application stopping a server run in another thread would: set
        # while this loop sleeps in its selector, which only a thread-safe wake-up ends.
        threading.Timer(0.2, setattr, args=(server, "should_exit", True)).start()
    # No timeout of our own: its timer would wake the loop too. Only the setter's wake-up can
    # end this wait (else pytest's timeout fails the test).
    await serving
    assert server.should_exit


async def test_a_flag_set_then_unset_leaves_the_loop_waiting_not_spinning() -> None:
    server, sock = _server()
    ticks = _ticks(server)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    await wait_until(lambda: server.started)
    server.should_exit = True
    server.should_exit = False  # changed its mind before the loop looked
    await asyncio.sleep(1.5)
    assert not serving.done()
    assert len(ticks) <= 4, len(ticks)  # a tick a second, not a busy loop
    server.should_exit = True
    await asyncio.wait_for(serving, 10)
