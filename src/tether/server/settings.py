"""Server settings: flags win over environment variables, which win over defaults."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from tether.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_chars: int = 100_000
    max_metadata_bytes: int = 16_384
    max_body_bytes: int = 1_048_576
    max_queue: int = 16
    max_header_bytes: int = 65_536
    """The request line and headers of one request, together (``tether serve``: 431 beyond)."""


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
    allowed_hosts: tuple[str, ...] = ()
    """With no API keys, Host names served besides localhost and IP addresses (``*``: any)."""
    allowed_origins: tuple[str, ...] = ()
    """With no API keys, web origins besides the server's own that may change state."""
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
        for name in ("allowed_hosts", "allowed_origins"):
            raw = env.get(f"TETHER_{name.upper()}")
            if raw:
                values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
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
