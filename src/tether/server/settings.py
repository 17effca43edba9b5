"""Server settings: flags win over environment variables, which win over defaults."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tether.errors import ConfigError
from tether.memory.budget import IngestLimits


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_chars: int = 100_000
    max_metadata_bytes: int = 16_384
    max_body_bytes: int = 1_048_576
    max_queue: int = 16
    # Knowledge and memory, per document and per user (``TETHER_<NAME>`` for each).
    max_document_chars: int = 2_000_000
    """Characters of text one document may give; extraction stops past it (413)."""
    max_document_chunks: int = 5_000
    max_ingest_seconds: float = 60.0
    """Wall time to parse, chunk and embed one document (413 past it)."""
    max_ingestions: int = 2
    """Documents one user may have read in at once (429 with Retry-After beyond)."""
    max_storage_bytes: int = 100_000_000
    """Memory and knowledge one user may keep: text and embeddings (413 past it)."""

    @property
    def ingest(self) -> IngestLimits:
        return IngestLimits(
            max_chars=self.max_document_chars,
            max_chunks=self.max_document_chunks,
            max_seconds=self.max_ingest_seconds,
        )


_ENV_LIMITS: dict[str, type[int] | type[float]] = {
    "max_document_chars": int,
    "max_document_chunks": int,
    "max_ingest_seconds": float,
    "max_ingestions": int,
    "max_storage_bytes": int,
}
"""Limits read from ``TETHER_<NAME>`` (``TETHER_MAX_STORAGE_BYTES``…)."""


def _limits_from_env(env: Mapping[str, str]) -> Limits | None:
    values: dict[str, int | float] = {}
    for name, kind in _ENV_LIMITS.items():
        variable = "TETHER_" + name.upper()
        if env.get(variable):
            try:
                values[name] = kind(env[variable])
            except ValueError:
                raise ConfigError(f"{variable}={env[variable]!r} is not a number") from None
            if not values[name] > 0:
                raise ConfigError(f"{variable} must be positive, got {env[variable]!r}")
    return Limits(**values) if values else None  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    data_dir: Path = Path(".tether")
    store: str | None = None
    """A SQLite path or ``postgresql://`` URL; default ``<data_dir>/tether.db``."""
    model: str | None = None
    """Default model spec for agents that name none (``TETHER_MODEL``, else ``local``)."""
    insecure: bool = False
    """Allow a non-loopback bind with no API keys (everyone is the local principal)."""
    drain_timeout: float = 10.0
    admission_wait: float = 30.0
    """Seconds a waiting (``wait``/``stream``) request may wait for room in a full queue."""
    lease_ttl: float = 30.0
    node: str | None = None
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then ``TETHER_*`` variables, then explicit (non-None) overrides."""
        env = os.environ
        values: dict[str, object] = {}
        if env.get("TETHER_HOST"):
            values["host"] = env["TETHER_HOST"]
        if env.get("TETHER_PORT"):
            try:
                values["port"] = int(env["TETHER_PORT"])
            except ValueError:
                raise ConfigError(f"TETHER_PORT={env['TETHER_PORT']!r} is not a port") from None
        if env.get("TETHER_DATA_DIR"):
            values["data_dir"] = Path(env["TETHER_DATA_DIR"])
        if env.get("TETHER_STORE"):
            values["store"] = env["TETHER_STORE"]
        if env.get("TETHER_MODEL"):
            values["model"] = env["TETHER_MODEL"]
        if env.get("TETHER_NODE"):
            values["node"] = env["TETHER_NODE"]
        if env.get("TETHER_LEASE_TTL"):
            try:
                values["lease_ttl"] = float(env["TETHER_LEASE_TTL"])
            except ValueError:
                raise ConfigError(
                    f"TETHER_LEASE_TTL={env['TETHER_LEASE_TTL']!r} is not a number"
                ) from None
        if env.get("TETHER_DRAIN_TIMEOUT"):
            try:
                values["drain_timeout"] = float(env["TETHER_DRAIN_TIMEOUT"])
            except ValueError:
                raise ConfigError(
                    f"TETHER_DRAIN_TIMEOUT={env['TETHER_DRAIN_TIMEOUT']!r} is not a number"
                ) from None
        limits = _limits_from_env(env)
        if limits is not None:
            values["limits"] = limits
        values.update({k: v for k, v in overrides.items() if v is not None})
        if "data_dir" in values and not isinstance(values["data_dir"], Path):
            values["data_dir"] = Path(str(values["data_dir"]))
        return cls(**values)  # type: ignore[arg-type]

    @property
    def store_url(self) -> str:
        return self.store or str(self.data_dir / "tether.db")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
