"""Server settings: flags win over environment variables, which win over defaults."""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tether.errors import ConfigError
from tether.memory.budget import IngestLimits
from tether.models.local import check_caps
from tether.records import PrincipalLimits
from tether.server.tokens import JwtSettings

# One key drove 672 concurrent model calls across 1,500 sessions before these existed: a caller
# gets room for real work (64 conversations answering at once, 1,024 turns waiting behind them,
# 100,000 sessions kept) and no more. An app that fronts many users with one key raises them.
DEFAULT_PRINCIPAL_LIMITS = PrincipalLimits(running_turns=64, queued_turns=1024, sessions=100_000)
_PRINCIPAL_ENV = {
    "running_turns": "TETHER_MAX_RUNNING_TURNS",
    "queued_turns": "TETHER_MAX_QUEUED_TURNS",
    "sessions": "TETHER_MAX_SESSIONS",
}


def _positive(variable: str, raw: str, kind: Callable[[str], float]) -> float:
    """``raw`` read as a number above 0, or a ConfigError naming ``variable``."""
    try:
        value = kind(raw)
    except ValueError:
        value = math.nan
    if not value > 0:  # NaN fails too
        raise ConfigError(f"{variable}={raw!r}: use a number above 0")
    return value


def _principal_limits(env: Mapping[str, str]) -> PrincipalLimits:
    values: dict[str, int | None] = {}
    for name, var in _PRINCIPAL_ENV.items():
        raw = env.get(var, "").strip().lower()
        if not raw:
            values[name] = getattr(DEFAULT_PRINCIPAL_LIMITS, name)
        else:
            values[name] = None if raw == "off" else int(_positive(var, raw, int))
    return PrincipalLimits(**values)


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_chars: int = 100_000
    max_metadata_bytes: int = 16_384
    max_body_bytes: int = 1_048_576
    max_queue: int = 16
    max_header_bytes: int = 65_536
    """The request line and headers of one request, together (``tether serve``: 431 beyond)."""
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
            values[name] = _positive(variable, env[variable], kind)
    return Limits(**values) if values else None  # type: ignore[arg-type]


_ENV_VALUES: dict[str, tuple[str, Callable[[str], object]]] = {
    "host": ("TETHER_HOST", str),
    "port": ("TETHER_PORT", int),
    "data_dir": ("TETHER_DATA_DIR", Path),
    "store": ("TETHER_STORE", str),
    "model": ("TETHER_MODEL", str),
    "node": ("TETHER_NODE", str),
    "lease_ttl": ("TETHER_LEASE_TTL", float),
    "drain_timeout": ("TETHER_DRAIN_TIMEOUT", float),
    "workers": ("TETHER_WORKERS", int),
}
"""Settings read as they are from ``TETHER_*`` (checked by ``_check_runtime_values``)."""


FACES: tuple[str, ...] = ("openai", "a2a", "mcp", "langgraph", "agui")
"""The protocol faces a server can serve besides tether's own API (each ``server/faces/…``)."""


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
    """This server's name in the owner ids of the leases it holds; with ``workers``, each
    worker is ``<node>-w1``, ``<node>-w2``… (``node-w1``… when none is set)."""
    workers: int = 1
    """Server processes sharing the one listening socket and the one store (``serve`` only;
    ``TETHER_WORKERS``). 1: the server runs in this process, with no other."""
    worker: int = 0
    """This process's number among ``workers`` (from 1), set by the supervisor; 0: the only
    server process."""
    pin_cpu: bool = True
    """``serve`` on SQLite pins its event loop's thread and the store's thread to one CPU,
    each worker's to its own (:mod:`tether.affinity`); ``TETHER_PIN_CPU=off`` leaves the
    kernel to place them."""
    one_off_ttl: float | None = 30 * 86400.0
    """Seconds a session that an OpenAI-face call without a session made is kept after its
    latest turn (then swept with its history), so stateless clients do not pile up sessions
    without end; ``TETHER_ONE_OFF_TTL`` (``off``: kept like any other)."""
    faces: frozenset[str] = frozenset(FACES)
    """The protocol faces served (DESIGN §9); ``TETHER_FACES_<NAME>=off`` turns one off
    (``TETHER_FACES_OPENAI=off``…)."""
    limits: Limits = field(default_factory=Limits)
    principal: PrincipalLimits = DEFAULT_PRINCIPAL_LIMITS
    """What one principal may hold at once (TETHER_MAX_RUNNING_TURNS, TETHER_MAX_QUEUED_TURNS,
    TETHER_MAX_SESSIONS; ``off`` for no bound)."""
    jwt: JwtSettings | None = None
    """Keys JWTs are verified against (``TETHER_JWT_*``, :mod:`tether.server.tokens`); None:
    API keys only."""

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Defaults, then ``TETHER_*`` variables, then explicit (non-None) overrides."""
        env = os.environ
        values: dict[str, object] = {}
        for name, (variable, kind) in _ENV_VALUES.items():
            raw = env.get(variable)
            if not raw:
                continue
            try:
                values[name] = kind(raw)
            except ValueError:
                what = {"port": "a port", "workers": "a whole number"}.get(name, "a number")
                raise ConfigError(f"{variable}={raw!r} is not {what}") from None
        for name in ("allowed_hosts", "allowed_origins"):
            raw = env.get(f"TETHER_{name.upper()}")
            if raw:
                values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
        one_off = env.get("TETHER_ONE_OFF_TTL", "").strip().lower()
        if one_off:
            values["one_off_ttl"] = None if one_off == "off" else _seconds(one_off)
        pin = env.get("TETHER_PIN_CPU", "").strip().lower()
        if pin:
            if pin not in _ON + _OFF:
                raise ConfigError(f"TETHER_PIN_CPU={pin!r}: on or off")
            values["pin_cpu"] = pin in _ON
        faces = _faces_from_env(env)
        if faces is not None:
            values["faces"] = faces
        limits = _limits_from_env(env)
        if limits is not None:
            values["limits"] = limits
        values["principal"] = _principal_limits(env)
        values["jwt"] = JwtSettings.from_env(env)
        check_caps(env)  # the embedded model's, read when it is first used
        given = {k: v for k, v in overrides.items() if v is not None}
        _check_runtime_values({**values, **given}, given.keys())
        values.update(given)
        if "data_dir" in values and not isinstance(values["data_dir"], Path):
            values["data_dir"] = Path(str(values["data_dir"]))
        return cls(**values)  # type: ignore[arg-type]

    @property
    def store_url(self) -> str:
        return self.store or str(self.data_dir / "tether.db")

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"TETHER_ONE_OFF_TTL={raw!r}: seconds above 0, or off")
    return value


def _faces_from_env(env: Mapping[str, str]) -> frozenset[str] | None:
    """The faces ``TETHER_FACES_<NAME>`` leave on (None: no such variable set)."""
    served = set(FACES)
    told = False
    for name in FACES:
        variable = f"TETHER_FACES_{name.upper()}"
        raw = env.get(variable, "").strip().lower()
        if not raw:
            continue
        if raw not in _ON + _OFF:
            raise ConfigError(f"{variable}={raw!r}: on or off")
        told = True
        if raw in _OFF:
            served.discard(name)
    return frozenset(served) if told else None


_ON = ("on", "true", "1", "yes")
_OFF = ("off", "false", "0", "no")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_NODE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
"""A node name becomes the first part of owner ids ``node|host|pid|nonce``: no ``|``."""


def _check_runtime_values(values: Mapping[str, object], from_flags: Collection[str]) -> None:
    """Refuse values the scheduler cannot run with, naming where each came from.

    ``float()`` accepts ``nan`` and ``inf``: a NaN lease makes every expiry comparison false,
    an infinite one means a dead node's sessions are never taken over, and ``serve`` rounds
    the drain timeout up to an int (ValueError / OverflowError at shutdown).
    """

    def source(name: str) -> str:
        return f"--{name.replace('_', '-')}" if name in from_flags else f"TETHER_{name.upper()}"

    ttl = values.get("lease_ttl")
    if isinstance(ttl, float | int) and not (math.isfinite(ttl) and ttl > 0):
        raise ConfigError(f"{source('lease_ttl')}={ttl!r}: seconds, a finite number above 0")
    drain = values.get("drain_timeout")
    if isinstance(drain, float | int) and not (math.isfinite(drain) and drain >= 0):
        raise ConfigError(f"{source('drain_timeout')}={drain!r}: seconds, a finite number >= 0")
    port = values.get("port")
    if isinstance(port, int) and not 0 <= port <= 65535:
        # 0: a free port the system picks (a test's server); above 65535 bind() overflows.
        raise ConfigError(f"{source('port')}={port!r}: a TCP port, 0-65535")
    workers = values.get("workers")
    if isinstance(workers, int) and workers < 1:
        raise ConfigError(f"{source('workers')}={workers!r}: a number of processes, 1 or more")
    node = values.get("node")
    if node is not None and not (isinstance(node, str) and _NODE.fullmatch(node)):
        raise ConfigError(
            f"{source('node')}={node!r}: a node name is 1-64 characters of letters, digits "
            "and '._:-'"
        )
