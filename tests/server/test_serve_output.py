"""What ``tether serve`` prints: its banner once it listens, a clear error for a taken port, one
access line per request (off with ``--no-access-log``), and no library's log lines."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server import apps
from tests.server.conftest import PYTHONPATH, ROOT, ServerFactory
from tether.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.slow

TETHER_SERVE = [sys.executable, "-m", "tether", "serve", "tests.server.apps:app"]


def test_the_server_log_says_what_a_newcomer_needs_and_nothing_else(
    make_server: ServerFactory, fake_openai: FakeOpenAIServer
) -> None:
    srv = make_server("--log-level", "info", env={"FAKE_OPENAI_URL": fake_openai.base_url})
    with srv.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/v1/sessions/nope").status_code == 404
        reply = c.post("/api/chat", json={"message": "hi", "agent_name": "upstream"})
        assert reply.status_code == 200, reply.text
    srv.stop()
    log = srv.output()

    # The banner comes once the socket listens and the app has started, with the real URL.
    served = ", ".join([*(a.name for a in apps.agents), "upstream"])  # the fake upstream's too
    banner = f"tether: serving {served} on {srv.url} (store "
    assert banner in log, log
    assert log.index("Application startup complete") < log.index(banner)
    # One line per request, with its status.
    assert log.count('"GET /healthz HTTP/1.1" 200') == 1, log
    assert log.count('"GET /v1/sessions/nope HTTP/1.1" 404') == 1, log
    assert log.count('"POST /api/chat HTTP/1.1" 200') == 1, log
    # The request tether made to the model provider is not the server log's business.
    assert "HTTP Request" not in log and "httpx" not in log, log


def test_no_access_log_turns_the_request_lines_off(make_server: ServerFactory) -> None:
    srv = make_server("--log-level", "info", "--no-access-log")
    with srv.client() as c:
        assert c.get("/healthz").status_code == 200
    srv.stop()
    log = srv.output()
    assert "tether: serving" in log
    assert "GET /healthz" not in log, log


def test_a_taken_port_is_an_error_that_says_how_to_pick_another(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = _serve("--port", str(port), "--data-dir", str(tmp_path))
    assert code == 2, output
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in output
    assert f"--port {port + 1}" in output and "TETHER_PORT" in output
    assert "serving" not in output  # never announced
    assert "Traceback" not in output


def test_an_embedder_that_does_not_exist_stops_the_server_as_it_starts(tmp_path: Path) -> None:
    """As every other TETHER_* variable: it used to start, answer /readyz ok, and fail every
    memory and knowledge write with a 500."""
    code, output = _serve("--port", "0", "--data-dir", str(tmp_path), TETHER_EMBEDDER="bogus")
    assert code == 2, output
    assert "TETHER_EMBEDDER='bogus'" in output and "openai:<model>" in output
    assert "serving" not in output and "Traceback" not in output


def test_an_embedder_spec_is_checked_where_it_is_given() -> None:
    from tether import ConfigError
    from tether.memory.service import MemoryService
    from tether.store import InMemoryStore

    for spec in ("bogus", "openai:", "openai: ", "cohere:embed"):
        with pytest.raises(ConfigError, match="unknown embedder"):
            MemoryService(InMemoryStore(), embedder=spec)
    MemoryService(InMemoryStore(), embedder="openai:text-embedding-3-small")  # nothing reached


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_3(tmp_path: Path) -> None:
    """As with ``--workers``: it was two tracebacks and some hundred lines from uvicorn."""
    code, output = _serve("--port", "0", "--store", "postgresql://nobody@127.0.0.1:9/none")
    assert code == 3, output
    assert "cannot open the store: postgresql: " in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 3, output


def _serve(*args: str, **env: str) -> tuple[int, str]:
    """``tether serve args`` that is expected to stop by itself: its exit code and output."""
    done = subprocess.run(
        [*TETHER_SERVE, *args],
        cwd=ROOT,
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout + done.stderr
