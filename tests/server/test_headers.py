"""Request heads are bounded: a huge header or request line gets a 431 problem and costs the
server neither memory nor its event loop; heads under the bound, and bodies, are untouched.

A real ``tether serve`` subprocess, spoken to over raw sockets (so nothing client-side limits
what is sent).
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.server.conftest import Server

MB = 1024 * 1024


def address(server: Server) -> tuple[str, int]:
    url = urlsplit(server.url)
    assert url.hostname and url.port
    return url.hostname, url.port


def send_huge(server: Server, head: bytes, size: int, tail: bytes) -> tuple[int, dict[str, Any]]:
    """Send ``head``, ``size`` bytes of ``a``, ``tail``; the status and JSON body answered."""
    with socket.create_connection(address(server), timeout=60) as s:
        s.sendall(head)
        block = b"a" * 65_536
        try:
            for _ in range(size // len(block)):
                s.sendall(block)
            s.sendall(tail)
        except OSError:
            pass  # the server answered and stopped reading: read what it said
        data = b""
        while chunk := s.recv(65_536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)


def huge_key(server: Server, size: int) -> tuple[int, dict[str, Any]]:
    return send_huge(
        server, b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: ", size, b"\r\n\r\n"
    )


def vm_kb(server: Server, field: str) -> int:
    with open(f"/proc/{server.proc.pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field}")


def test_a_huge_api_key_is_431(server: Server) -> None:
    status, body = huge_key(server, 5 * MB)
    assert status == 431
    assert body["type"].endswith("/headers-too-large")
    assert body["status"] == 431
    assert "65536 bytes" in body["detail"]
    with server.client() as c:
        assert c.get("/healthz").status_code == 200


@pytest.mark.parametrize("size", [66_000, 100_000, 130_000])
def test_a_head_just_over_the_bound_is_431_too(server: Server, size: int) -> None:
    # Heads that arrive within one or two reads: counted by the parser's callbacks, not reads.
    status, body = huge_key(server, size)
    assert status == 431 and body["type"].endswith("/headers-too-large")


def test_a_huge_request_line_is_431(server: Server) -> None:
    status, body = send_huge(
        server, b"GET /healthz?q=", 5 * MB, b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    assert status == 431 and body["type"].endswith("/headers-too-large")


def test_huge_heads_in_parallel_cost_no_memory_and_health_answers(server: Server) -> None:
    """Four 25 MB keys at once (before the bound: over 100 MB of RSS and a stalled loop)."""
    with server.client() as c:
        # A memory search first: it needs the embedder, which loads in the background at start.
        assert c.post("/v1/memory", json={"content": "warm up"}).status_code == 201
        assert c.post("/v1/memory/search", json={"query": "warm"}).status_code == 200
    before = vm_kb(server, "VmHWM")
    answers: list[int] = []
    threads = [
        threading.Thread(target=lambda: answers.append(huge_key(server, 25 * MB)[0]))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    health: list[int] = []
    with server.client() as c:
        while True:  # at least once, and for as long as the huge requests are in flight
            health.append(c.get("/healthz").status_code)
            if not any(t.is_alive() for t in threads):
                break
    for t in threads:
        t.join()
    assert answers == [431] * 4
    assert health and set(health) == {200}
    grown_mb = (vm_kb(server, "VmHWM") - before) / 1024
    assert grown_mb < 32, f"the server's peak RSS grew by {grown_mb:.0f} MB"


def test_heads_under_the_bound_and_bodies_are_untouched(server: Server) -> None:
    with server.client() as c:
        # One header just under the bound.
        assert c.get("/healthz", headers={"X-Pad": "p" * 60_000}).status_code == 200
        # Many requests on one keep-alive connection: each head is counted alone.
        for _ in range(20):
            assert c.get("/healthz", headers={"X-Pad": "p" * 10_000}).status_code == 200
        # A body far larger than the head bound is the body limit's business, not this one's.
        sid = "headers-body"
        assert c.post("/v1/sessions", json={"agent": "echo", "session_id": sid}).status_code == 201
        r = c.patch(f"/v1/sessions/{sid}", json={"metadata": {"note": "n" * 12_000}})
        assert r.status_code == 200, r.text
        big = c.post(f"/v1/sessions/{sid}/turns", json={"input": "x" * 90_000})
        assert big.status_code == 200, big.text
        assert c.get("/healthz").status_code == 200


def test_pipelined_requests_with_small_heads_pass(server: Server) -> None:
    """Several requests sent back to back before any answer (HTTP/1.1 pipelining)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"p" * 20_000 + b"\r\n\r\n"
    with socket.create_connection(address(server), timeout=30) as s:
        s.sendall(request * 8)
        data = b""
        while data.count(b"HTTP/1.1 200") < 8:
            chunk = s.recv(65_536)
            assert chunk, data
            data += chunk
    assert b" 431 " not in data
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
