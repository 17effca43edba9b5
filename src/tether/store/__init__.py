"""Durable state behind one protocol: in-memory (the spec), SQLite (embedded), PostgreSQL.

The backends are imported when first named, so ``import tether`` loads no database driver: a
script on SQLite never imports asyncpg.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tether.errors import ConfigError
from tether.store.protocol import Store

if TYPE_CHECKING:
    from tether.store.inmemory import InMemoryStore
    from tether.store.inmemory import InMemoryStore as MemoryStore
    from tether.store.postgres import PostgresStore
    from tether.store.sqlite import SQLiteStore

__all__ = [
    "InMemoryStore",
    "MemoryStore",
    "PostgresStore",
    "SQLiteStore",
    "Store",
    "open_store_url",
]

_BACKENDS = {
    "InMemoryStore": "tether.store.inmemory",
    "SQLiteStore": "tether.store.sqlite",
    "PostgresStore": "tether.store.postgres",
}


def __getattr__(name: str) -> Any:
    if name == "MemoryStore":  # the in-memory store's earlier name, kept as an alias
        name = "InMemoryStore"
    module = _BACKENDS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def open_store_url(url: str) -> Store:
    """A store for ``url``: ``memory://``, ``sqlite:///path``, ``postgresql://…`` (or
    ``postgres://…``; query parameters asyncpg does not know, such as ``search_path``, become
    server settings), or a plain file path."""
    if url == "memory://":
        from tether.store.inmemory import InMemoryStore

        return InMemoryStore()
    if url.startswith(("postgresql://", "postgres://")):
        from tether.store.postgres import PostgresStore

        return PostgresStore(url)
    if "://" in url and not url.startswith("sqlite:///"):
        raise ConfigError(f"unsupported store URL {url!r}")
    from tether.store.sqlite import SQLiteStore

    return SQLiteStore(Path(url.removeprefix("sqlite:///")))
