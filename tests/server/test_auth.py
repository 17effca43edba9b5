"""Authentication: local mode, API keys made with the CLI, revocation, and refusing to start
on a public address with no keys. Every connection goes to 127.0.0.1."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.server.cli_keys import assert_problem, create_key, tether
from tests.server.conftest import Server, ServerFactory, start_server
from tether.errors import StoreError


def eventually(check: Callable[[], bool], within: float = 2.5) -> None:
    """Poll ``check`` until it holds (the server caches "do keys exist" for a second)."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def agents(server: Server, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(server.url + "/v1/agents", headers=headers or {}, timeout=10)


@pytest.mark.slow
def test_local_mode_needs_no_credentials(make_server: ServerFactory) -> None:
    srv = make_server()
    with srv.client() as c:
        assert c.get("/v1/agents").status_code == 200
        r = c.post("/api/chat", json={"message": "hi", "session_id": "local-1"})
        assert r.status_code == 200, r.text
        assert r.json()["response"] == "saw [] then hi"
        assert c.get("/v1/sessions/local-1").status_code == 200


@pytest.mark.slow
def test_keys_turn_authentication_on_while_the_server_runs(make_server: ServerFactory) -> None:
    srv = make_server()
    with srv.client() as anonymous:
        assert anonymous.post("/v1/sessions", json={"session_id": "anon"}).status_code == 201
        key = create_key(srv.data_dir, "alice")
        assert key.secret.startswith("tk_")

        eventually(lambda: anonymous.get("/v1/agents").status_code == 401)
        for method, path in (
            ("GET", "/v1/agents"),
            ("GET", "/v1/sessions"),
            ("GET", "/v1/sessions/anon"),
            ("POST", "/v1/sessions/anon/turns"),
            ("POST", "/api/chat"),
        ):
            r = anonymous.request(method, path, json={"input": "hi", "message": "hi"})
            assert_problem(r, 401, "unauthorized")
            assert r.headers["www-authenticate"] == "Bearer"
        # Health checks and the API description stay open.
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/readyz").status_code == 200
        assert anonymous.get("/openapi.json").status_code == 200

    for headers in (
        {"Authorization": f"Bearer {key.secret}"},
        {"authorization": f"bearer {key.secret}"},
        {"X-API-Key": key.secret},
    ):
        assert agents(srv, headers).status_code == 200, headers
    for headers in (
        {"Authorization": "Bearer tk_00000000_not-a-real-key-at-all-000000"},
        {"Authorization": f"Bearer {key.secret}x"},
        {"Authorization": f"Bearer {key.secret[:-1]}"},
        {"Authorization": "Bearer nonsense"},
        {"Authorization": f"Basic {key.secret}"},
        {"Authorization": key.secret},
        {"Authorization": "Bearer"},
        {"X-API-Key": "tk_wrong"},
    ):
        r = agents(srv, headers)
        assert_problem(r, 401, "unauthorized")
        assert key.secret not in r.text

    # The key's user is not the local principal: the anonymous session is not theirs.
    with srv.client(key.secret) as alice:
        assert_problem(alice.get("/v1/sessions/anon"), 404, "not-found")
        assert alice.get("/v1/sessions").json()["data"] == []


@pytest.mark.slow
def test_a_revoked_key_is_refused_and_local_mode_stays_off(make_server: ServerFactory) -> None:
    srv = make_server()
    key = create_key(srv.data_dir, "bob")
    auth = {"Authorization": f"Bearer {key.secret}"}
    assert agents(srv, auth).status_code == 200

    revoked = tether(srv.data_dir, "keys", "revoke", key.id)
    assert revoked.returncode == 0, revoked.stderr
    eventually(lambda: agents(srv, auth).status_code == 401)
    assert_problem(agents(srv, auth), 401, "unauthorized")
    assert_problem(agents(srv, {"X-API-Key": key.secret}), 401, "unauthorized")
    # Revoking the last key does not quietly reopen the server to anonymous callers: watch
    # past the server's one-second cache of "do keys exist".
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        assert_problem(agents(srv), 401, "unauthorized")
        time.sleep(0.1)

    again = tether(srv.data_dir, "keys", "revoke", key.id)
    assert again.returncode != 0
    assert key.id in again.stderr
    unknown = tether(srv.data_dir, "keys", "revoke", "nosuchkey")
    assert unknown.returncode != 0


def test_keys_list_never_shows_secrets(tmp_path: Path) -> None:
    one = create_key(tmp_path, "carol")
    two = create_key(tmp_path, "dave", "--tenant", "acme", "--admin")
    assert tether(tmp_path, "keys", "revoke", one.id).returncode == 0
    listed = tether(tmp_path, "keys", "list")
    assert listed.returncode == 0, listed.stderr
    text = listed.stdout + listed.stderr
    for key in (one, two):
        assert key.id in text
        assert key.secret not in text
        # The random part (it may itself contain "_", so cut at the known prefix).
        assert key.secret.removeprefix(f"tk_{key.id}_") not in text
    assert re.search(rf"{one.id}.*carol.*revoked", listed.stdout)
    assert re.search(rf"{two.id}.*acme.*dave.*admin.*active", listed.stdout)


def test_keys_create_prints_the_secret_alone_on_stdout(tmp_path: Path) -> None:
    proc = tether(tmp_path, "keys", "create", "--user", "erin")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    secret = lines[-1].split()[-1]
    assert re.fullmatch(r"tk_[0-9a-f]+_[A-Za-z0-9_-]{32,}", secret), secret
    assert secret not in proc.stderr
    # Each key is new.
    assert create_key(tmp_path, "erin").secret != secret


@pytest.mark.parametrize(
    "args", [("--user", ""), ("--user", "  "), ("--user", "a b"), ("--user", "ok", "--tenant", "")]
)
def test_keys_need_a_real_user_and_tenant(tmp_path: Path, args: tuple[str, ...]) -> None:
    proc = tether(tmp_path, "keys", "create", *args)
    assert proc.returncode != 0
    assert "tk_" not in proc.stdout
    assert "without spaces" in proc.stderr
    assert "Traceback" not in proc.stderr
    listed = tether(tmp_path, "keys", "list")
    assert "active" not in listed.stdout


@pytest.mark.slow
def test_a_public_bind_with_no_keys_refuses_to_start(make_server: ServerFactory) -> None:
    srv = make_server("--host", "0.0.0.0", wait=False)
    try:
        code = srv.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("the server started on 0.0.0.0 with no keys")
    assert code != 0
    output = srv.output()
    assert "0.0.0.0" in output
    assert "--insecure" in output
    assert "tether keys create" in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_public_bind_with_insecure_starts(make_server: ServerFactory) -> None:
    srv = make_server("--host", "0.0.0.0", "--insecure")  # ready: answered on 127.0.0.1
    assert srv.url.startswith("http://127.0.0.1:")
    with srv.client() as c:
        assert c.get("/v1/agents").status_code == 200


@pytest.mark.slow
def test_a_public_bind_with_a_key_starts_and_requires_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    key = create_key(data_dir, "frank")
    srv = start_server(data_dir, "--host", "0.0.0.0")
    try:
        assert srv.url.startswith("http://127.0.0.1:")
        assert_problem(agents(srv), 401, "unauthorized")
        assert agents(srv, {"X-API-Key": key.secret}).status_code == 200
    finally:
        srv.stop()


class _SlowKeys:
    """ApiKeys' one question, answered after a moment, counted."""

    def __init__(self) -> None:
        self.looks = 0
        self.fail = False

    async def any_exist(self) -> bool:
        self.looks += 1
        await asyncio.sleep(0.05)
        if self.fail:
            raise StoreError("the store is away")
        return False


async def test_requests_that_find_the_key_cache_stale_share_one_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under load every request of the second the cache expired in asked the store itself
    # (two reads each while no key exists): a few per turn at 64 sessions.
    from tether.server import auth

    keys = _SlowKeys()
    authenticator = auth.Authenticator(keys, None)  # type: ignore[arg-type]
    assert not any(await asyncio.gather(*(authenticator.keys_exist() for _ in range(50))))
    assert keys.looks == 1
    assert not await authenticator.keys_exist()  # fresh: from the cache
    assert keys.looks == 1
    monkeypatch.setattr(auth, "_CACHE_SECONDS", 0.0)
    keys.fail = True
    with pytest.raises(StoreError):  # a failed look fails its waiters, and is not kept
        await asyncio.gather(*(authenticator.keys_exist() for _ in range(5)))
    assert keys.looks == 2
    keys.fail = False
    # A caller cancelled while it waits ends nobody else's look.
    first = asyncio.create_task(authenticator.keys_exist())
    second = asyncio.create_task(authenticator.keys_exist())
    await asyncio.sleep(0.01)
    first.cancel()
    assert await second is False
    assert keys.looks == 3
