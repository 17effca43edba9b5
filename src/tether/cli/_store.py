"""The local store as the CLI reaches it: opened for one command, used through the services.

Sessions go through :class:`~tether.scheduler.sessions.SessionService` (with a canceller that
works through the store, since no scheduler runs in a CLI command), keys through
:class:`~tether.keys.ApiKeys`, memory through :class:`~tether.memory.service.MemoryService` —
the same rules as the server's, never a store call of the CLI's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tether.cli._options import settings
from tether.cli._output import fail
from tether.errors import ConfigError, TetherError
from tether.records import LOCAL_PRINCIPAL, ForgetReport, Principal, SessionKey
from tether.scheduler.sessions import SessionService, StoreCanceller
from tether.tools.workspace import discard_owner, root_for

if TYPE_CHECKING:
    from tether.store.protocol import Store

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


def _local_key(session_id: str, owner: Principal = LOCAL_PRINCIPAL) -> SessionKey:
    return SessionKey.of(owner, session_id)


# -- the services over the local store ---------------------------------------------------------
def sessions_of(s: Store, workspace_root: Path | None = None) -> SessionService:
    """Sessions of the local store. No scheduler runs here: a turn is cancelled through the
    store (a queued one at once; a running one by the process that runs it, waited for)."""
    return SessionService(s, StoreCanceller(s), workspace_root=workspace_root)


def workspaces_of(data_dir: Path | None) -> Path:
    """The workspaces' root of the data dir the command works on (as ``Runtime`` puts it)."""
    return root_for(Path(settings(data_dir=data_dir).data_dir))


async def list_sessions(
    s: Store, limit: int, owner: Principal = LOCAL_PRINCIPAL
) -> list[dict[str, Any]]:
    """``owner``'s sessions (the embedded user's by default), as ``tether sessions list`` prints."""
    page = await sessions_of(s).page(owner.tenant, owner.user, limit=limit, include_expired=True)
    return [
        {
            "session_id": r.key.session_id,
            "agent": r.agent,
            "updated_at": r.updated_at,
        }
        for r in page.records
    ]


async def session_history(
    s: Store, session_id: str, owner: Principal = LOCAL_PRINCIPAL
) -> list[dict[str, Any]]:
    """A local session's items, as ``tether sessions show`` prints them."""
    k = _local_key(session_id, owner)
    sessions = sessions_of(s)
    if await sessions.get(k) is None:
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
        for i in await sessions.items(k, limit=100_000)
    ]


async def delete_session(
    s: Store,
    session_id: str,
    owner: Principal = LOCAL_PRINCIPAL,
    workspace_root: Path | None = None,
) -> bool:
    """Delete a local session and its workspace; its queued or running turns are cancelled
    first."""
    return await sessions_of(s, workspace_root).delete(_local_key(session_id, owner))


async def forget_user(
    s: Store, tenants: Sequence[str], user: str, workspace_root: Path | None = None
) -> list[ForgetReport]:
    """Everything of ``user`` in each tenant (workspaces too), their turns cancelled first."""
    from tether.memory.service import MemoryService

    reports = []
    memory = MemoryService(s)
    for tenant in tenants:
        await sessions_of(s).cancel_all_of(tenant, user, "user_data_deleted")
        reports.append(await memory.forget_user(tenant, user))
        await discard_owner(workspace_root, tenant, user)
    return reports
