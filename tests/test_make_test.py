"""``make test`` is the whole suite: with a PostgreSQL answering on 127.0.0.1:5432 it runs the
PostgreSQL tests in a throw-away database (dropped afterwards), and it says which groups ran.

These run ``make test`` itself on one PostgreSQL test, in a subprocess, without the URL this
session may have been given, so what is tested is the detection a developer's machine gets.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from tests.conformance.postgres_db import in_use, run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ONE_POSTGRES_TEST = "tests/store/test_postgres.py::test_data_survives_close_and_reopen"


def make_test(pytest_args: str, **env: str) -> str:
    if shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "python").exists():
        pytest.skip("needs make and the checkout's .venv (make venv)")
    # Nothing of the outer run's: its URL, CI, or variables an outer make passes down.
    outer = ("TETHER_TEST_POSTGRES_URL", "CI", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    clean = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(
        # -o: never rebuild the venv from inside a test run, even if its stamp looks stale.
        [
            "make",
            "-o",
            ".venv/.installed",
            "test",
            f"PYTEST_ARGS={pytest_args} -p no:cacheprovider",
        ],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def postgres_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=2):
            return True
    except OSError:
        return False


async def databases_named(user: str, prefix: str) -> list[str]:
    conn = await asyncpg.connect(f"postgresql://{user}@127.0.0.1:5432/template1", timeout=5)
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", prefix
        )
        return [r["datname"] for r in rows]
    finally:
        await conn.close()


def test_make_test_runs_the_postgres_tests_in_a_throwaway_database() -> None:
    if not postgres_answers():
        pytest.skip("no PostgreSQL answers on 127.0.0.1:5432, so there is nothing to detect")
    # The restart test of another make test process waits meanwhile (its database is made and
    # dropped here, outside any fixture that would hold it off).
    with in_use():
        _runs_in_a_throwaway_database()


def _runs_in_a_throwaway_database() -> None:
    output = make_test(f"{ONE_POSTGRES_TEST} -q")

    made = re.search(r"throw-away database (tether_test_\d+) \((\S+)@127\.0\.0\.1:5432\)", output)
    assert made, output
    database, user = made.groups()
    assert re.search(rf"PostgreSQL\s+1 ran\s+\[{database} on 127\.0\.0\.1:5432\]", output)
    assert re.search(r"^1 passed", output, re.MULTILINE), output
    assert "skipped" not in output
    # Dropped afterwards, with the database the test session made next to it.
    assert run(lambda: databases_named(user, database)) == []


def test_make_test_says_when_the_postgres_tests_are_skipped() -> None:
    output = make_test(f"{ONE_POSTGRES_TEST} -q", TETHER_TEST_POSTGRES_URL="")

    assert "TETHER_TEST_POSTGRES_URL is set empty: the PostgreSQL tests will be skipped" in output
    assert re.search(r"PostgreSQL\s+0 ran, 1 skipped: PostgreSQL tests skipped", output), output
