"""Durable state behind one protocol: in-memory (the spec), SQLite (embedded), PostgreSQL."""

from __future__ import annotations

from pathlib import Path

from tether.errors import ConfigError
from tether.store.base import Store
from tether.store.memory import MemoryStore
from tether.store.postgres import PostgresStore
from tether.store.sqlite import SQLiteStore

__all__ = ["MemoryStore", "PostgresStore", "SQLiteStore", "Store", "open_store_url"]


def open_store_url(url: str) -> Store:
    """A store for ``url``: ``memory://``, ``sqlite:///path``, ``postgresql://…`` (or
    ``postgres://…``; query parameters asyncpg does not know, such as ``search_path``, become
    server settings), or a plain file path."""
    if url == "memory://":
        return MemoryStore()
    if url.startswith("sqlite:///"):
        return SQLiteStore(Path(url.removeprefix("sqlite:///")))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    if "://" in url:
        raise ConfigError(f"unsupported store URL {url!r}")
    return SQLiteStore(Path(url))
