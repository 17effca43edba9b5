"""``TETHER_LEASE_TTL``, ``TETHER_NODE``, ``TETHER_DRAIN_TIMEOUT`` and ``TETHER_WORKERS``:
parsed, checked, and reaching the runtime the server builds. A bad value is a ConfigError
naming the variable, at start, not a server that runs with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import Agent, ConfigError
from tether.server.app import create_app
from tether.server.settings import FACES, Settings
from tether.testing import ScriptedModel

VARS = ("TETHER_LEASE_TTL", "TETHER_NODE", "TETHER_DRAIN_TIMEOUT", "TETHER_WORKERS")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)


def test_defaults_without_the_variables() -> None:
    s = Settings.from_env()
    assert (s.lease_ttl, s.node, s.drain_timeout, s.workers) == (30.0, None, 10.0, 1)


def test_the_variables_are_read_and_reach_the_runtime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TETHER_LEASE_TTL", "7.5")
    monkeypatch.setenv("TETHER_NODE", "eu-west-1a.node-3")
    monkeypatch.setenv("TETHER_DRAIN_TIMEOUT", "0")  # 0: cancel running turns at once
    s = Settings.from_env(data_dir=tmp_path)
    assert (s.lease_ttl, s.node, s.drain_timeout) == (7.5, "eu-west-1a.node-3", 0.0)
    app = create_app(s, [Agent(name="a", model=ScriptedModel(default="ok"))])
    scheduler = app.state.tether.runtime.scheduler
    assert scheduler.lease_ttl == 7.5
    assert scheduler.owner.startswith("eu-west-1a.node-3|")


def test_flags_win_over_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_NODE", "from-env")
    monkeypatch.setenv("TETHER_DRAIN_TIMEOUT", "4")
    monkeypatch.setenv("TETHER_WORKERS", "3")
    assert Settings.from_env().workers == 3
    s = Settings.from_env(node="from-flag", drain_timeout=1.5, workers=2)
    assert (s.node, s.drain_timeout, s.workers) == ("from-flag", 1.5, 2)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TETHER_LEASE_TTL", "thirty"),
        ("TETHER_LEASE_TTL", "0"),  # a lease that has expired when it is granted
        ("TETHER_LEASE_TTL", "-5"),
        ("TETHER_LEASE_TTL", "nan"),  # float() takes it; every expiry comparison is then false
        ("TETHER_LEASE_TTL", "inf"),  # a dead node's sessions would never be taken over
        ("TETHER_DRAIN_TIMEOUT", "soon"),
        ("TETHER_DRAIN_TIMEOUT", "-1"),
        ("TETHER_DRAIN_TIMEOUT", "nan"),  # serve() rounds it up: ValueError at shutdown
        ("TETHER_DRAIN_TIMEOUT", "inf"),  # ... or OverflowError
        ("TETHER_NODE", "a|b"),  # "|" separates the parts of an owner id
        ("TETHER_NODE", "   "),
        ("TETHER_NODE", "node\n2"),
        ("TETHER_NODE", "n" * 65),
        ("TETHER_ONE_OFF_TTL", "0"),
        ("TETHER_ONE_OFF_TTL", "soon"),
        ("TETHER_FACES_OPENAI", "maybe"),
        ("TETHER_WORKERS", "0"),
        ("TETHER_WORKERS", "-2"),
        ("TETHER_WORKERS", "two"),
        ("TETHER_WORKERS", "1.5"),
        ("TETHER_PORT", "70000"),  # bind() raised OverflowError: a traceback, exit 1
        ("TETHER_PORT", "-1"),
        # Read by the embedded model at its first turn: every turn failed, the server ran on.
        ("TETHER_LOCAL_MAX_TOKENS", "abc"),
        ("TETHER_LOCAL_MAX_SECONDS", "0"),
    ],
)
def test_bad_values_are_config_errors_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=name):
        Settings.from_env()


@pytest.mark.parametrize(
    "overrides",
    [
        {"lease_ttl": 0.0},
        {"drain_timeout": float("nan")},
        {"node": "x|y"},
        {"workers": 0},
        {"port": 99999},
    ],
)
def test_bad_values_from_flags_are_refused_too(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env(**overrides)


def test_each_face_is_switched_by_its_own_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env().faces == frozenset(FACES)
    monkeypatch.setenv("TETHER_FACES_OPENAI", "off")
    assert "openai" not in Settings.from_env().faces
    monkeypatch.setenv("TETHER_ONE_OFF_TTL", "off")
    assert Settings.from_env().one_off_ttl is None
