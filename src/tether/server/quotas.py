"""Per-user bounds on memory and knowledge: what a user may keep, and read in at once.

* **Storage**: a user's records (memory items and knowledge chunks, their text and embeddings,
  :meth:`~tether.memory.service.MemoryService.storage_used`) stay within
  ``Limits.max_storage_bytes``. A write is admitted by :meth:`Quotas.reserve` just before it is
  stored, or refused whole (413 ``storage-quota``): nothing is half-written.
* **Ingestions**: at most ``Limits.max_ingestions`` documents of one user are parsed and
  embedded at once (:meth:`Quotas.ingestion`); one more is refused with 429 and
  ``Retry-After``, rather than parked holding its body in memory.

Both are kept per process: the storage check and the write it admits run under one lock per
user, so this process's writes never overshoot; processes sharing a store can each add at most
one write past the bound before they see it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

from tether.errors import StorageQuotaExceeded
from tether.records import Principal
from tether.server.problems import Problem
from tether.server.settings import Limits

INGESTION_RETRY_SECONDS = 5
"""What ``Retry-After`` says when a user's ingestions are at their bound."""

_User = tuple[str, str]


class StorageMeter(Protocol):
    """What a quota reads: :meth:`MemoryService.storage_used`."""

    async def storage_used(self, principal: Principal) -> int: ...


@dataclass
class _Lock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Tasks holding or waiting for it: the entry goes when the last one leaves."""


class Quotas:
    def __init__(self, meter: StorageMeter, limits: Limits) -> None:
        self.meter = meter
        self.limits = limits
        self._locks: dict[_User, _Lock] = {}
        self._ingesting: dict[_User, int] = {}

    async def ensure_room(self, principal: Principal) -> None:
        """:class:`StorageQuotaExceeded` when ``principal`` has no room left at all: checked
        before a document is read, so a user at the bound costs no parsing."""
        used = await self.meter.storage_used(principal)
        if used >= self.limits.max_storage_bytes:
            raise StorageQuotaExceeded(self._full(0, used))

    def _full(self, size: int, used: int) -> str:
        needs = f"this needs {size:,} bytes of storage and " if size else ""
        return (
            f"{needs}{used:,} of your {self.limits.max_storage_bytes:,} bytes are in use: delete"
            " memory or documents to make room"
        )

    @asynccontextmanager
    async def reserve(self, principal: Principal, size: int) -> AsyncIterator[None]:
        """Hold room for ``size`` more bytes of ``principal``'s records while they are written;
        :class:`StorageQuotaExceeded` when they do not fit."""
        user = (principal.tenant, principal.user)
        entry = self._locks.setdefault(user, _Lock())
        entry.users += 1
        try:
            async with entry.lock:
                used = await self.meter.storage_used(principal)
                if used + size > self.limits.max_storage_bytes:
                    raise StorageQuotaExceeded(self._full(size, used))
                yield
        finally:
            entry.users -= 1
            if not entry.users:
                del self._locks[user]

    @asynccontextmanager
    async def ingestion(self, principal: Principal) -> AsyncIterator[None]:
        """One of ``principal``'s documents being read in; 429 past ``max_ingestions``."""
        user = (principal.tenant, principal.user)
        if self._ingesting.get(user, 0) >= self.limits.max_ingestions:
            raise Problem(
                429,
                "too-many-ingestions",
                "Too many documents at once",
                f"at most {self.limits.max_ingestions} of your documents are read in at once;"
                " retry when one is done",
                headers={"Retry-After": str(INGESTION_RETRY_SECONDS)},
            )
        self._ingesting[user] = self._ingesting.get(user, 0) + 1
        try:
            yield
        finally:
            self._ingesting[user] -= 1
            if not self._ingesting[user]:
                del self._ingesting[user]
