"""The local store as the CLI reaches it: opened for one command, and every direct call on it.

Each call the commands make on the store itself sits in one small function here, so that when a
session service takes them over there is one list to replace (the memory commands go through
:class:`~tether.memory.service.MemoryService` instead and are not here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tether.cli._options import settings
from tether.cli._output import fail
from tether.errors import ConfigError, TetherError
from tether.records import LOCAL_PRINCIPAL, ApiKey, SessionKey, SessionRecord

if TYPE_CHECKING:
    from tether.store.protocol import KeyStore, SessionStore, Store

T = TypeVar("T")


def on_store(data_dir: Path | None, store: str | None, fn: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``fn`` on the local store (opened, migrated, and closed again)."""

    async def go() -> T:
        s = _open_store(data_dir, store)
        await s.open()
        try:
            return await fn(s)
        finally:
            await s.close()

    return _run(go)


def _open_store(data_dir: Path | None, store: str | None) -> Store:
    from tether.store import open_store_url

    return open_store_url(settings(data_dir=data_dir, store=store).store_url)


def _run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    try:
        return asyncio.run(main())
    except TetherError as exc:
        raise fail(str(exc)) from None


def _local_key(session_id: str) -> SessionKey:
    return SessionKey.of(LOCAL_PRINCIPAL, session_id)


# -- sessions -------------------------------------------------------------------------------------
async def list_sessions(s: SessionStore, limit: int) -> list[dict[str, Any]]:
    """The embedded user's sessions, as the rows ``tether sessions list`` prints."""
    records = await s.list_sessions("local", "local", limit=limit)
    return [
        {
            "session_id": r.key.session_id,
            "agent": r.agent,
            "updated_at": r.updated_at,
        }
        for r in records
    ]


async def session_history(s: SessionStore, session_id: str) -> list[dict[str, Any]]:
    """A local session's items, as ``tether sessions show`` prints them."""
    k = _local_key(session_id)
    if await s.get_session(k) is None:
        raise ConfigError(f"no session {session_id!r}")
    return [
        {
            "kind": i.kind,
            "content": i.content,
            "complete": i.complete,
            "tool_name": i.tool_name,
            "arguments": i.arguments,
            "excluded": i.excluded,
        }
        for i in await s.list_items(k, limit=100_000)
    ]


async def delete_session(s: SessionStore, session_id: str) -> bool:
    deleted: bool = await s.delete_session(_local_key(session_id))
    return deleted


async def open_chat_session(
    s: SessionStore, key: SessionKey, agent: str
) -> tuple[SessionRecord, bool]:
    """The chat's session: created, or resumed as it is; ``(record, created)``."""
    return await s.create_session(key, agent, exist_ok=True)


# -- API keys -------------------------------------------------------------------------------------
async def save_api_key(s: KeyStore, key: ApiKey) -> None:
    await s.create_api_key(key)


async def list_api_keys(s: KeyStore) -> list[ApiKey]:
    return await s.list_api_keys()


async def revoke_api_key(s: KeyStore, key_id: str) -> bool:
    done: bool = await s.revoke_api_key(key_id)
    return done
