"""Fail closed: local mode (no API keys) serves only this machine, only its own names, and no
cross-origin state change; credentials are never ambiguous; no key acts as ``local``.

``App.asgi()`` is checked in process (any client address can be given to the ASGI app) and
under a real uvicorn bound to 0.0.0.0, called on this machine's non-loopback address; the rest
runs on a real ``tether serve``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from tests.conformance.postgres_db import run
from tests.server.apps import app as test_app
from tests.server.cli_keys import assert_problem, create_key, tether
from tests.server.conftest import PYTHONPATH, ROOT, Server, ServerFactory, free_port
from tether.errors import ConfigError
from tether.keys import ApiKeys, mint_key
from tether.server.settings import Settings
from tether.store import open_store_url


# -- App.asgi(): the caller must be on this machine ----------------------------------------------
@asynccontextmanager
async def asgi_client(
    settings: Settings, client: tuple[str, int], host: str = "127.0.0.1"
) -> AsyncIterator[httpx.AsyncClient]:
    asgi = test_app.asgi(settings)
    async with asgi.router.lifespan_context(asgi):
        transport = httpx.ASGITransport(app=asgi, client=client)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as c:
            yield c


@pytest.mark.parametrize("address", ["203.0.113.7", "192.168.1.20", "10.0.0.3", "::ffff:8.8.8.8"])
async def test_asgi_with_no_keys_refuses_callers_from_elsewhere(
    tmp_path: Path, address: str
) -> None:
    # Settings' host is the default 127.0.0.1: under gunicorn -b 0.0.0.0 it says nothing.
    async with asgi_client(Settings(data_dir=tmp_path), (address, 40000)) as c:
        r = await c.get("/v1/agents")
        assert r.status_code == 401, r.text
        assert r.json()["type"].endswith("/unauthorized")
        r = await c.post("/v1/sessions", json={"agent": "echo", "session_id": "s"})
        assert r.status_code == 401
        assert (await c.get("/healthz")).status_code == 200


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2", "::1", "::ffff:127.0.0.1"])
async def test_asgi_with_no_keys_serves_this_machine(tmp_path: Path, address: str) -> None:
    async with asgi_client(Settings(data_dir=tmp_path), (address, 40000)) as c:
        assert (await c.get("/v1/agents")).status_code == 200
        r = await c.post("/v1/sessions", json={"agent": "echo", "session_id": "mine"})
        assert r.status_code == 201, r.text


async def test_asgi_behind_a_proxy_on_this_machine_needs_keys(tmp_path: Path) -> None:
    async with asgi_client(Settings(data_dir=tmp_path), ("127.0.0.1", 40000)) as c:
        for header in ("X-Forwarded-For", "Forwarded", "X-Real-IP"):
            r = await c.get("/v1/agents", headers={header: "for=203.0.113.7"})
            assert r.status_code == 401, header


async def test_asgi_insecure_serves_everyone_as_chosen(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, insecure=True)
    async with asgi_client(settings, ("203.0.113.7", 40000), host="192.0.2.10:8000") as c:
        assert (await c.get("/v1/agents")).status_code == 200


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (None if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address: str = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.slow
def test_asgi_under_uvicorn_on_all_interfaces(tmp_path: Path) -> None:
    """``uvicorn --host 0.0.0.0`` of ``App.asgi()`` with no keys: what ``gunicorn -b`` does."""
    outside = non_loopback_address()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to call from")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "TETHER_DATA_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "tests.server.asgi_apps:make"]
    cmd += ["--host", "0.0.0.0", "--port", str(port), "--log-level", "warning"]
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        # From this machine's public address: not local, so no access without a key.
        far = httpx.get(f"http://{outside}:{port}/v1/agents", timeout=10)
        assert_problem(far, 401, "unauthorized")
        write = httpx.post(f"http://{outside}:{port}/v1/sessions", json={}, timeout=10)
        assert_problem(write, 401, "unauthorized")
        # From loopback: local mode as usual.
        assert httpx.get(f"http://127.0.0.1:{port}/v1/agents", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- Host: no DNS rebinding ----------------------------------------------------------------------
def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil"]
)
def test_local_mode_refuses_foreign_host_names(server: Server, host: str) -> None:
    with server.client() as c:
        r = c.get("/v1/agents", headers={"Host": host.format(port=port_of(server))})
        assert_problem(r, 403, "host-not-allowed")
        r = c.post("/api/chat", json={"message": "hi"}, headers={"Host": "evil.example"})
        assert_problem(r, 403, "host-not-allowed")
        assert c.get("/healthz", headers={"Host": "evil.example"}).status_code == 200


@pytest.mark.parametrize(
    "host", ["127.0.0.1:{port}", "localhost:{port}", "LOCALHOST", "app.localhost:{port}", "[::1]"]
)
def test_local_mode_serves_its_own_names(server: Server, host: str) -> None:
    with server.client() as c:
        r = c.get("/v1/agents", headers={"Host": host.format(port=port_of(server))})
        assert r.status_code == 200, r.text


@pytest.mark.slow
def test_allowed_hosts_and_origins_are_settings(make_server: ServerFactory) -> None:
    srv = make_server(
        env={
            "TETHER_ALLOWED_HOSTS": "tether.lan, box",
            "TETHER_ALLOWED_ORIGINS": "http://ui.tether.lan:3000",
        }
    )
    with srv.client() as c:
        assert c.get("/v1/agents", headers={"Host": "tether.lan:8000"}).status_code == 200
        assert c.get("/v1/agents", headers={"Host": "box"}).status_code == 200
        assert_problem(c.get("/v1/agents", headers={"Host": "other.lan"}), 403)
        ok = c.post(
            "/v1/sessions", json={"agent": "echo"}, headers={"Origin": "http://ui.tether.lan:3000"}
        )
        assert ok.status_code == 201, ok.text
        no = c.post(
            "/v1/sessions", json={"agent": "echo"}, headers={"Origin": "http://ui.tether.lan:3001"}
        )
        assert_problem(no, 403, "origin-not-allowed")


# -- Origin: no cross-site writes ----------------------------------------------------------------
def test_a_cross_site_multipart_upload_writes_nothing(server: Server) -> None:
    """A web page's form post to the local server: a CORS simple request, sent unasked."""
    with server.client() as c:
        for origin in ("https://evil.example", "null", "http://127.0.0.1:1"):
            r = c.post(
                "/v1/knowledge/crossed/documents",
                files={"file": ("note.txt", b"planted text", "text/plain")},
                data={"scope": "tenant"},
                headers={"Origin": origin},
            )
            assert_problem(r, 403, "origin-not-allowed")
        for scope in ("tenant", "user"):
            listed = c.get("/v1/knowledge/crossed/documents", params={"scope": scope})
            assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/sessions", {"agent": "echo"}),
        ("POST", "/api/chat", {"message": "hi"}),
        ("POST", "/v1/memory", {"content": "planted"}),
        ("PATCH", "/v1/sessions/victim", {"metadata": {"x": 1}}),
        ("DELETE", "/v1/sessions/victim", None),
        ("DELETE", "/v1/users/me/data", None),
    ],
)
def test_cross_origin_state_changes_are_refused(
    server: Server, method: str, path: str, body: object
) -> None:
    with server.client() as c:
        c.post("/v1/sessions", json={"agent": "echo", "session_id": "victim"})
        r = c.request(method, path, json=body, headers={"Origin": "https://evil.example"})
        assert_problem(r, 403, "origin-not-allowed")
        sneaky = c.request(method, path, json=body, headers={"Sec-Fetch-Site": "cross-site"})
        assert_problem(sneaky, 403, "origin-not-allowed")
        assert c.get("/v1/sessions/victim").json()["metadata"] == {}


def test_same_origin_and_origin_less_writes_pass(server: Server) -> None:
    with server.client() as c:
        same = c.post(
            "/v1/sessions",
            json={"agent": "echo"},
            headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"},
        )
        assert same.status_code == 201, same.text
        assert c.post("/v1/sessions", json={"agent": "echo"}).status_code == 201
        # Reading is not a state change; and no CORS header lets another origin read it.
        read = c.get("/v1/agents", headers={"Origin": "https://evil.example"})
        assert read.status_code == 200
        assert "access-control-allow-origin" not in read.headers


# -- credentials ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str, str]]:
    from tests.server.conftest import start_server

    data_dir = tmp_path_factory.mktemp("keyed")
    one, two = create_key(data_dir, "amy").secret, create_key(data_dir, "ben").secret
    srv = start_server(data_dir)
    yield srv, one, two
    srv.stop()


def raw_get(server: Server, headers: list[tuple[str, str]]) -> httpx.Response:
    """A GET with exactly these header lines (repeated names kept)."""
    with httpx.Client(base_url=server.url, timeout=10) as c:
        request = c.build_request("GET", "/v1/agents")
        request.headers = httpx.Headers([("host", request.headers["host"]), *headers])
        return c.send(request)


def test_ambiguous_credentials_are_400(keyed: tuple[Server, str, str]) -> None:
    srv, amy, ben = keyed
    for headers in (
        [("Authorization", f"Bearer {amy}"), ("Authorization", f"Bearer {ben}")],
        [("Authorization", f"Bearer {amy}"), ("Authorization", f"Bearer {amy}")],
        [("Authorization", f"Bearer {amy}"), ("X-API-Key", ben)],
        [("X-API-Key", ben), ("Authorization", f"Bearer {amy}")],
        [("X-API-Key", amy), ("X-API-Key", ben)],
        # A repeated header is refused whatever it holds, as Authorization twice is.
        [("X-API-Key", amy), ("X-API-Key", amy)],
    ):
        r = raw_get(srv, headers)
        assert_problem(r, 400, "ambiguous-credentials")
        assert amy not in r.text and ben not in r.text


def test_one_key_however_sent_is_fine(keyed: tuple[Server, str, str]) -> None:
    srv, amy, _ = keyed
    for headers in (
        [("Authorization", f"Bearer {amy}")],
        [("X-API-Key", amy)],
        [("Authorization", f"Bearer {amy}"), ("X-API-Key", amy)],
    ):
        assert raw_get(srv, headers).status_code == 200, headers


def test_ambiguity_is_refused_in_local_mode_too(server: Server) -> None:
    r = raw_get(server, [("Authorization", "Bearer tk_a_x"), ("X-API-Key", "tk_b_y")])
    assert_problem(r, 400, "ambiguous-credentials")


# -- no key acts as the local principal ----------------------------------------------------------
def test_keys_cannot_be_made_for_the_local_tenant(tmp_path: Path) -> None:
    proc = tether(tmp_path, "keys", "create", "--user", "local", "--tenant", "local")
    assert proc.returncode != 0
    assert "tk_" not in proc.stdout
    assert "reserved" in proc.stderr and "Traceback" not in proc.stderr
    other = tether(tmp_path, "keys", "create", "--user", "alice", "--tenant", "local")
    assert other.returncode != 0

    async def create() -> None:
        store = open_store_url(str(tmp_path / "tether.db"))
        await store.open()
        try:
            with pytest.raises(ConfigError, match="reserved"):
                await ApiKeys(store).create("local", "local")
        finally:
            await store.close()

    run(create)


@pytest.mark.slow
def test_an_old_key_of_the_local_tenant_reads_nothing(make_server: ServerFactory) -> None:
    srv = make_server()
    with srv.client() as c:
        r = c.post("/v1/sessions", json={"agent": "echo", "session_id": "mine"})
        assert r.status_code == 201, r.text
    stale = mint_key("local", "local", admin=True)  # as made before the tenant was reserved

    async def plant() -> None:
        store = open_store_url(str(srv.data_dir / "tether.db"))
        await store.open()
        try:
            await store.create_api_key(stale.record)
        finally:
            await store.close()

    run(plant)
    with srv.client(stale.secret) as c:
        assert_problem(c.get("/v1/sessions/mine"), 401, "unauthorized")
        assert_problem(c.get("/v1/sessions"), 401, "unauthorized")
