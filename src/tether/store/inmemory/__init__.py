"""The in-memory store: the runnable specification of :class:`~tether.store.protocol.Store`.

Sessions, turns and memory live in dicts (:mod:`.state`); each role is one module (sessions and
keys, turns and leases, recall). Nothing survives the process: use it for tests and for trying
things out; the conformance suite holds the SQL backends to exactly this behaviour.
"""

from __future__ import annotations

from tether.errors import StoreError
from tether.records import ForgetReport
from tether.store.inmemory.recall import Recall
from tether.store.inmemory.sessions import Sessions
from tether.store.inmemory.turns import Turns

__all__ = ["InMemoryStore"]


class InMemoryStore(Sessions, Turns, Recall):
    _open = False
    """Only ping() looks: like the SQL stores, a store not open does not answer (readiness)."""

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def ping(self) -> None:
        if not self._open:
            raise StoreError("the store is not open")

    async def forget_user(self, tenant: str, user: str) -> ForgetReport:
        doomed = [k for k in self._sessions if k.tenant == tenant and k.owner == user]
        for k in doomed:
            for turn_id in self._sessions.pop(k).turns:
                self._cancels.pop(turn_id, None)
        memory, documents = self._forget_recall(tenant, user)
        return ForgetReport(sessions=len(doomed), memory=memory, documents=documents)
