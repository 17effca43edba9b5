"""What the capability suites share: keys, namespaces, record builders and short write paths.

Every suite builds its fixtures through these, so a test reads as the behaviour it checks and
not as the calls that set it up. Nothing here asserts anything about a backend except
:func:`acquire` (a free lease must be granted) and :func:`version` (the batched and the single
version reads agree), both of which every suite relies on.
"""

from __future__ import annotations

from array import array
from typing import Any

from tether.events import TOOL_RESULT, TURN_ENDED, TURN_STARTED, EventType
from tether.records import (
    CHUNK,
    AgentRef,
    Document,
    Event,
    Item,
    Lease,
    MemoryRecord,
    Namespace,
    NewEvent,
    NewItem,
    SessionKey,
    Turn,
)
from tether.store.protocol import Store

# -- sessions, turns and leases ---------------------------------------------------------------

SHORT_TTL = 0.05
"""A lease that expires during the test (seconds)."""
PAST_SHORT_TTL = 0.15
"""Long enough a sleep for a SHORT_TTL lease to have expired."""
LONG_TTL = 30.0
CLOCK_SLACK = 5.0
"""Tolerance when comparing a store's timestamps to this process's clock."""

Snapshot = tuple[list[Item], list[Turn], dict[str, list[Event]]]


def key(session_id: str = "s1", *, owner: str = "alice", tenant: str = "acme") -> SessionKey:
    return SessionKey(tenant, owner, session_id)


def ev(seq: int, type: EventType = TOOL_RESULT, **data: Any) -> NewEvent:
    return NewEvent(seq, type, dict(data))


def call(call_id: str, tool: str = "lookup") -> NewItem:
    return NewItem("tool_call", call_id=call_id, tool_name=tool, arguments='{"q": 1}')


def result(call_id: str, content: str = "ok", tool: str = "lookup") -> NewItem:
    return NewItem("tool_result", content, call_id=call_id, tool_name=tool)


async def new_session(store: Store, k: SessionKey | None = None) -> SessionKey:
    k = k or key()
    await store.create_session(k, "assistant")
    return k


async def acquire(
    store: Store, k: SessionKey, owner: str = "node-a", ttl: float = LONG_TTL
) -> Lease:
    lease = await store.acquire_lease(k, owner, ttl)
    assert lease is not None, f"{owner} could not acquire a free lease"
    return lease


async def running_turn(
    store: Store,
    k: SessionKey,
    turn_id: str,
    *,
    lease: Lease | None = None,
    owner: str = "node-a",
    ttl: float = LONG_TTL,
    text: str = "hello",
    agent: AgentRef | None = None,
) -> Lease:
    """Queue ``turn_id`` and start it (user item, event seq 2) under ``lease`` or a new one."""
    await store.enqueue_turn(k, turn_id=turn_id, input=text, policy="enqueue", agent=agent)
    if lease is None:
        lease = await acquire(store, k, owner, ttl)
    await store.start_turn(lease, turn_id, [NewItem("user", text)], [ev(2, TURN_STARTED)])
    return lease


async def snapshot(store: Store, k: SessionKey) -> Snapshot:
    """Everything the session holds, for checking that a rejected write changed nothing."""
    items = await store.list_items(k, limit=100_000)
    turns = await store.list_turns(k, limit=100_000)
    events = {t.id: await store.list_events(k, t.id) for t in turns}
    return items, turns, events


def ended_events(events: list[Event]) -> list[Event]:
    return [e for e in events if e.type == TURN_ENDED]


# -- memory and knowledge ---------------------------------------------------------------------

ALICE = Namespace.user("acme", "alice")
BOB = Namespace.user("acme", "bob")
ALICE_ELSEWHERE = Namespace.user("globex", "alice")
"""The same user id in another tenant: another person."""
ALICE_S1 = Namespace.session(SessionKey("acme", "alice", "s1"))
BOB_S1 = Namespace.session(SessionKey("acme", "bob", "s1"))
"""Another user's session with the same session id."""
ALICE_S2 = Namespace.session(SessionKey("acme", "alice", "s2"))
AGENT = Namespace.of_agent("acme", "assistant")
TENANT = Namespace.of_tenant("acme")
FOREIGN = (BOB, BOB_S1, ALICE_ELSEWHERE)
"""Namespaces from which nothing of Alice's may be seen or changed."""


def vec(*xs: float) -> bytes:
    """A float32 embedding, as the memory layer stores them."""
    return array("f", xs).tobytes()


def note(
    ns: Namespace,
    record_id: str,
    content: str,
    *,
    kind: str = "fact",
    collection: str = "",
    document_id: str | None = None,
    meta: dict[str, Any] | None = None,
    at: float = 1_700_000_000.0,
) -> MemoryRecord:
    return MemoryRecord(
        id=record_id,
        namespace=ns,
        kind=kind,
        content=content,
        collection=collection,
        document_id=document_id,
        meta=meta or {},
        created_at=at,
        updated_at=at,
    )


async def put(
    store: Store, ns: Namespace, record_id: str, content: str = "", **kw: Any
) -> MemoryRecord:
    return await store.put_memory(note(ns, record_id, content or record_id, **kw), vec(1.0, 0.0))


def document(ns: Namespace, doc_id: str, collection: str, chunks: int) -> Document:
    return Document(
        id=doc_id,
        namespace=ns,
        collection=collection,
        name=f"{doc_id}.txt",
        media_type="text/plain",
        chunks=chunks,
        chars=100 * chunks,
        created_at=1_700_000_000.0,
        meta={"source": "upload"},
    )


async def add_doc(
    store: Store, ns: Namespace, doc_id: str, collection: str = "docs", chunks: int = 2
) -> tuple[Document, list[MemoryRecord]]:
    doc = document(ns, doc_id, collection, chunks)
    parts = [
        (
            note(
                ns,
                f"{doc_id}-{n}",
                f"part {n} of {doc_id}",
                kind=CHUNK,
                collection=collection,
                meta={"document": doc.name, "chunk": n},
            ),
            vec(float(n), 1.0),
        )
        for n in range(chunks)
    ]
    await store.add_document(doc, parts)
    stored = await store.list_memory([ns], collection=collection, limit=1000)
    return doc, [r for r in stored if r.document_id == doc_id]


async def ids(store: Store, namespaces: list[Namespace], collection: str = "") -> list[str]:
    return [r.id for r in await store.list_memory(namespaces, collection=collection, limit=1000)]


async def version(store: Store, ns: Namespace, collection: str = "") -> int:
    single = await store.vector_version(ns, collection=collection)
    # The batched read must always agree with the single one.
    assert await store.vector_versions([ns], collection=collection) == [single]
    return single
