"""A real ``tether serve`` subprocess per test module (or per test when state matters)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tether.testing.fake_openai import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
# The checkout's own source first: a worktree's subprocesses must run its code, not the code
# the editable install points at.
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    data_dir: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def client(self, key: str | None = None, timeout: float = 30.0) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(
    data_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    target: str | None = "tests.server.apps:app",
    wait: bool = True,
) -> Server:
    port = free_port()
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir / f"server-{port}.log"
    full_env = {**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}
    cmd = [sys.executable, "-m", "tether", "serve"]
    if target:
        cmd.append(target)
    cmd += ["--port", str(port), "--data-dir", str(data_dir), "--log-level", "warning", *args]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", data_dir, log, full_env)
    if wait:
        wait_ready(server)
    return server


@contextmanager
def backend_store(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[str]:
    """The ``--store`` of a fixture parametrized ``["sqlite", "postgres"]``: a file in
    ``data_dir``, or a fresh schema of the session's PostgreSQL database (dropped afterwards;
    the test skips when no PostgreSQL is configured)."""
    if request.param != "postgres":
        yield str(data_dir / "tether.db")
        return
    from tests.conformance.postgres_db import fresh_schema

    database: str = request.getfixturevalue("postgres_database")  # skips when not set
    yield from fresh_schema(database)


def wait_ready(server: Server, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited {server.proc.returncode}:\n{server.output()}")
        try:
            if httpx.get(server.url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    server.stop(signal.SIGKILL)
    raise AssertionError(f"server not ready in {within}s:\n{server.output()}")


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, fake_openai: FakeOpenAIServer
) -> Iterator[Server]:
    """One server for a whole module (tests use distinct session ids or owners)."""
    srv = start_server(
        tmp_path_factory.mktemp("server"), env={"FAKE_OPENAI_URL": fake_openai.base_url}
    )
    yield srv
    srv.stop()


ServerFactory = Callable[..., Server]


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """Start servers owned by one test; all are stopped at its end."""
    started: list[Server] = []

    def make(*args: str, **kw: object) -> Server:
        srv = start_server(tmp_path / f"data{len(started)}", *args, **kw)  # type: ignore[arg-type]
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop(signal.SIGKILL)
