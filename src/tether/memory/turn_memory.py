"""Memory as one turn sees it: bound to the turn's principal, session, agent and policy.

The turn loop uses it to recall before the model runs and to keep automatic notes; tools reach
it as ``ToolContext.memory`` (the built-in ``remember`` and ``search_knowledge`` tools, and any
user tool that wants the caller's memory). Nothing here can name another principal's memory:
every namespace is built from the bound principal.

What the turn writes is held here, not stored: :meth:`TurnMemory.pending` hands it to the
turn's ending, which commits it in the same fenced transaction as the turn's last items, and
only if the ending keeps them (DESIGN §3). A failed, rolled-back or superseded turn leaves no
note behind, and the turn's own later steps recall only what earlier turns committed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from tether.agent import MemoryPolicy
from tether.errors import InvalidInput
from tether.memory import auto
from tether.memory.service import MemoryService
from tether.records import (
    Hit,
    MemoryKind,
    MemoryRecord,
    MemoryWrites,
    Namespace,
    PersonalScope,
    Principal,
    SessionKey,
)

log = logging.getLogger("tether.memory")

AUTO_AUTHOR = "auto"
MODEL_AUTHOR = "model"
KNOWLEDGE_IN_PROMPT = 3


@dataclass
class TurnMemory:
    service: MemoryService
    principal: Principal
    key: SessionKey
    agent: str
    policy: MemoryPolicy
    turn_id: str
    auto: bool = False
    """Keep automatic notes (resolved by the runner from the agent, the model and the server)."""
    _put: list[tuple[MemoryRecord, bytes]] = field(default_factory=list)
    _delete: list[tuple[Namespace, str]] = field(default_factory=list)

    def restore(self, held: MemoryWrites) -> None:
        """Take back the writes of a turn that parked on a decision and now goes on."""
        self._put = list(held.put)
        self._delete = list(held.delete)

    def pending(self) -> MemoryWrites:
        """What this turn wrote, for its ending to commit."""
        return MemoryWrites(tuple(self._put), tuple(self._delete))

    async def _write(self, ns: Namespace, content: str, *, kind: str, author: str) -> MemoryRecord:
        # Provenance names the session as well as the turn, whatever the scope: a turn is
        # found under its session only (GET /v1/sessions/{sid}/turns/{tid}).
        record, embedding = await self.service.prepare(
            self.principal,
            content,
            ns,
            kind=kind,
            session_id=self.key.session_id,
            turn_id=self.turn_id,
            author=author,
        )
        self._put.append((record, embedding))
        return record

    def namespaces(self, scopes: Sequence[str]) -> list[Namespace]:
        return self.service.readable(
            self.principal, scopes, session_id=self.key.session_id, agent=self.agent
        )

    def _own(self, scope: str) -> Namespace:
        if scope == "session":
            return Namespace.session(self.key)
        if scope == "user":
            return Namespace.user(self.key.tenant, self.key.owner)
        raise InvalidInput("the model may write session or user memory only")

    async def recall(self, query: str) -> list[Hit]:
        """Memory items and knowledge chunks for the prompt, best first."""
        hits: list[Hit] = []
        if self.policy.scopes and self.policy.recall_limit > 0 and query.strip():
            hits += await self.service.search(
                self.namespaces(self.policy.scopes), query, limit=self.policy.recall_limit
            )
        if self.policy.knowledge and not self.policy.knowledge_tool and query.strip():
            hits += await self.search_knowledge(query, limit=KNOWLEDGE_IN_PROMPT)
        return hits

    async def search_knowledge(self, query: str, *, limit: int = 5) -> list[Hit]:
        if not self.policy.knowledge:
            return []
        namespaces = self.namespaces(("session", "user", "agent", "tenant"))
        return await self.service.search_knowledge(
            namespaces, query, self.policy.knowledge, limit=limit
        )

    async def remember(
        self, content: str, *, scope: PersonalScope = "user", kind: MemoryKind = "fact"
    ) -> MemoryRecord:
        """Write session or user memory on the bound principal's behalf (the model's tool);
        stored when the turn ends well."""
        return await self._write(self._own(scope), content, kind=kind, author=MODEL_AUTHOR)

    async def keep_notes(self, text: str) -> list[MemoryRecord]:
        """Automatic notes from the user's message; an already known note is not stored twice."""
        if not self.auto:
            return []
        ns = self._own(self.policy.note_scope)
        kept: list[MemoryRecord] = []
        for note in auto.statements(text):
            known = await self.service.search([ns], note, limit=5)
            if any(h.record.content == note for h in known) or any(
                r.namespace == ns and r.content == note for r, _ in self._put
            ):
                continue
            # "My name is Bob" after "My name is Alice": the newer statement replaces the
            # older automatic note instead of leaving two answers to recall.
            attr = auto.attribute(note)
            for h in known:
                old = h.record
                if (
                    attr is not None
                    and old.meta.get("author") == AUTO_AUTHOR
                    and auto.attribute(old.content) == attr
                ):
                    self._delete.append((ns, old.id))
            kept.append(await self._write(ns, note, kind="note", author=AUTO_AUTHOR))
        return kept
