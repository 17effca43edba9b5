"""API keys made the way an operator makes them: ``tether keys …`` in its own process."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.server.conftest import ROOT

PROBLEM_JSON = "application/problem+json"


def tether(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tether <args> --data-dir <data_dir>`` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "tether", *args, "--data-dir", str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@dataclass(frozen=True)
class Key:
    id: str
    secret: str


def create_key(data_dir: Path, user: str, *extra: str) -> Key:
    proc = tether(data_dir, "keys", "create", "--user", user, *extra)
    assert proc.returncode == 0, proc.stderr
    secret = proc.stdout.strip().splitlines()[-1].split()[-1]
    found = re.search(r"created key (\S+)", proc.stderr)
    assert found, proc.stderr
    return Key(found.group(1), secret)


def assert_problem(response: httpx.Response, status: int, kind: str | None = None) -> None:
    """A problem+json of ``status`` (and ``type`` ending in ``kind``), with nothing leaked."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM_JSON, response.headers
    body = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == status
    assert all(isinstance(body[k], str) for k in ("type", "title", "detail"))
    if kind is not None:
        assert body["type"].endswith("/" + kind), body
    for leak in ("Traceback", 'File "', "Exception", "sqlite", "pydantic", "tether/"):
        assert leak not in response.text, response.text
