"""The knowledge and memory bounds come from ``TETHER_*`` variables, typed and checked."""

from __future__ import annotations

import pytest

from tether.errors import ConfigError
from tether.memory.budget import IngestLimits
from tether.server.settings import Limits, Settings


def test_defaults_are_the_documented_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DOCUMENT_CHARS",
        "DOCUMENT_CHUNKS",
        "INGEST_SECONDS",
        "INGESTIONS",
        "STORAGE_BYTES",
    ):
        monkeypatch.delenv(f"TETHER_MAX_{name}", raising=False)
    limits = Settings.from_env().limits
    assert limits == Limits()
    assert limits.ingest == IngestLimits(max_chars=2_000_000, max_chunks=5_000, max_seconds=60.0)
    assert (limits.max_storage_bytes, limits.max_ingestions) == (100_000_000, 2)


def test_each_bound_has_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TETHER_MAX_DOCUMENT_CHARS", "5000")
    monkeypatch.setenv("TETHER_MAX_DOCUMENT_CHUNKS", "7")
    monkeypatch.setenv("TETHER_MAX_INGEST_SECONDS", "2.5")
    monkeypatch.setenv("TETHER_MAX_INGESTIONS", "1")
    monkeypatch.setenv("TETHER_MAX_STORAGE_BYTES", "123456")
    limits = Settings.from_env().limits
    assert limits.ingest == IngestLimits(max_chars=5_000, max_chunks=7, max_seconds=2.5)
    assert (limits.max_ingestions, limits.max_storage_bytes) == (1, 123_456)
    assert limits.max_queue == Limits().max_queue  # the others keep their defaults


@pytest.mark.parametrize("value", ["lots", "1.5", "0", "-3"])
def test_a_bad_bound_is_a_config_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("TETHER_MAX_STORAGE_BYTES", value)
    with pytest.raises(ConfigError, match="TETHER_MAX_STORAGE_BYTES"):
        Settings.from_env()
