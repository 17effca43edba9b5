"""``App(agents=[...]).serve()`` and its alias ``AgentOS`` serve real HTTP from a user's script,
drain and exit 0 on SIGTERM, and refuse a public address with no keys (DESIGN §1.4, §10)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import PYTHONPATH, free_port

SCRIPT = """
import sys
from tether import Agent, {cls}
from tether.testing import ScriptedModel, reply_to

agents = [Agent(name="greeter", model=ScriptedModel(default=reply_to), memory={{"auto": False}})]
{cls}(agents=agents).serve(host=sys.argv[1], port=int(sys.argv[2]), data_dir=sys.argv[3],
                           drain_timeout=2, log_level="warning")
"""


def _run_script(tmp_path: Path, cls: str, host: str, port: int) -> subprocess.Popen[bytes]:
    """The script as a user runs it; its output goes to ``tmp_path / "out.log"``."""
    script = tmp_path / "myapp.py"
    script.write_text(SCRIPT.format(cls=cls))
    with (tmp_path / "out.log").open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, str(script), host, str(port), str(tmp_path / "data")],
            cwd=tmp_path,
            env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the script exited {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"the script's server was not ready in time:\n{log.read_text()}")


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["App", "AgentOS"])
def test_serve_from_a_script_answers_http_and_exits_cleanly(tmp_path: Path, cls: str) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _run_script(tmp_path, cls, "127.0.0.1", port)
    try:
        _wait_ready(proc, url, tmp_path / "out.log")
        with httpx.Client(base_url=url, timeout=30) as c:
            agents = c.get("/v1/agents").json()["data"]
            assert [a["name"] for a in agents] == ["greeter"]
            first = c.post("/api/chat", json={"message": "hi", "session_id": "app-1"})
            assert first.status_code == 200, first.text
            assert first.json() == {
                "response": "reply to: hi",
                "agent_name": "greeter",
                "session_id": "app-1",
                "turn_id": first.json()["turn_id"],
            }
            c.post("/api/chat", json={"message": "again", "session_id": "app-1"})
            items = c.get("/v1/sessions/app-1/items").json()["data"]
            assert [i["content"] for i in items] == [
                "hi",
                "reply to: hi",
                "again",
                "reply to: again",
            ]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        _stop(proc)
    # What it stored is where the script said: the data directory it passed.
    assert (tmp_path / "data" / "tether.db").exists()
    # It said where it listens, as `tether serve` does.
    log = (tmp_path / "out.log").read_text()
    assert f"tether: serving greeter on {url} (store {tmp_path / 'data'}" in log, log


@pytest.mark.slow
def test_serve_refuses_a_public_address_without_keys(tmp_path: Path) -> None:
    proc = _run_script(tmp_path, "AgentOS", "0.0.0.0", free_port())
    try:
        returncode = proc.wait(timeout=60)
    finally:
        _stop(proc)
    assert returncode != 0
    assert "refusing to listen on 0.0.0.0" in (tmp_path / "out.log").read_text()


HEAP_SCRIPT = """
import gc, os, signal, sys
from tether import Agent
from tether.app import serve
from tether.server.settings import Settings
from tether.testing import ScriptedModel

def ready(url):
    print("frozen", gc.get_freeze_count(), "threshold", gc.get_threshold()[0], flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

print("before", gc.get_freeze_count(), gc.get_threshold()[0], flush=True)
settings = Settings.from_env(host="127.0.0.1", port=0, data_dir=sys.argv[1], drain_timeout=1)
serve(settings, [Agent(name="a", model=ScriptedModel(default="ok"))], log_level="warning",
      on_ready=ready)
"""


@pytest.mark.slow
def test_a_served_process_freezes_what_it_started_with(tmp_path: Path) -> None:
    """Once it listens, a server's own process keeps what it was started with out of the
    collector's walks and raises the young threshold (server/heap.py); an application that
    embeds tether is left with its own settings until then."""
    script = tmp_path / "heap.py"
    script.write_text(HEAP_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "data")],
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    assert lines["before"] == "0 700"
    frozen, threshold = lines["frozen"].split(" threshold ")
    assert int(frozen) > 50_000  # the SDKs, FastAPI, the app: tens of thousands of objects
    assert int(threshold) > 700
