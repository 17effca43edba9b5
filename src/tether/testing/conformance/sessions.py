"""Sessions: create, read, list, update, expire and delete them, each under its own key.

A session is named by tenant, owner and id together; the same id under another owner or tenant is
another session, and ids that look alike to a LIKE pattern, a regex or a prefix scan stay apart.
Expiry is checked with real time (sessions of 50 ms), like lease expiry.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tether.errors import Conflict, InvalidInput, SessionNotFound, StoreError
from tether.records import AgentRef, NewDecision, NewItem, SessionOrder, TurnEnding, Usage
from tether.store import rules
from tether.store.protocol import Store
from tether.testing.conformance._support import (
    CLOCK_SLACK,
    LONG_TTL,
    acquire,
    ev,
    key,
    new_session,
    running_turn,
)


class SessionsConformance:
    """Sessions keyed by (tenant, owner, id): their records, listing, expiry and deletion.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """

    async def test_ping(self, store: Store) -> None:
        """An open store answers; a closed one raises StoreError (readiness reports it), and a
        store reopened answers again, with what it held."""
        k = await new_session(store)
        await store.ping()  # answers: no StoreError
        await store.close()
        with pytest.raises(StoreError):
            await store.ping()
        await store.open()
        await store.ping()
        assert (rec := await store.get_session(k)) is not None and rec.key == k

    async def test_create_and_get_session(self, store: Store) -> None:
        k = key()
        before = time.time()
        rec, created = await store.create_session(k, "assistant", metadata={"topic": "tax"})
        assert created is True
        assert rec.key == k
        assert rec.agent == "assistant"
        assert rec.metadata == {"topic": "tax"}
        assert rec.state == {}
        assert rec.revision == 1
        assert rec.expires_at is None
        assert before - CLOCK_SLACK <= rec.created_at <= time.time() + CLOCK_SLACK
        assert await store.get_session(k) == rec

    async def test_create_existing_session(self, store: Store) -> None:
        k = key()
        first, _ = await store.create_session(k, "assistant", metadata={"v": 1})
        again, created = await store.create_session(k, "other", metadata={"v": 2}, exist_ok=True)
        assert created is False
        assert again == first
        with pytest.raises(Conflict):
            await store.create_session(k, "other", metadata={"v": 3})
        assert await store.get_session(k) == first

    async def test_unknown_session(self, store: Store) -> None:
        k = key("nobody")
        assert await store.get_session(k) is None
        assert await store.get_turn(k, "t1") is None
        assert await store.list_events(k, "t1") == []
        assert await store.delete_session(k) is False
        with pytest.raises(SessionNotFound):
            await store.update_session(k, metadata={})
        with pytest.raises(SessionNotFound):
            await store.enqueue_turn(k, turn_id="t1", input="x", policy="enqueue")
        with pytest.raises(SessionNotFound):
            await store.list_items(k)
        with pytest.raises(SessionNotFound):
            await store.recent_items(k)
        with pytest.raises(SessionNotFound):
            await store.clear_items(k)
        with pytest.raises(SessionNotFound):
            await store.list_turns(k)
        with pytest.raises(SessionNotFound):
            await store.active_turns(k)
        with pytest.raises(SessionNotFound):
            await store.acquire_lease(k, "node-a", LONG_TTL)
        assert await store.list_sessions("acme", "alice") == []
        assert await store.sessions_needing_work() == []

    async def test_same_id_under_other_owner_or_tenant_is_another_session(
        self, store: Store
    ) -> None:
        mine, bobs, other_tenant = key("chat"), key("chat", owner="bob"), key("chat", tenant="z")
        await store.create_session(mine, "assistant", metadata={"who": "alice"})
        # Not a Conflict: these are different sessions that happen to share an id.
        _, created_b = await store.create_session(bobs, "helper", metadata={"who": "bob"})
        _, created_t = await store.create_session(other_tenant, "helper")
        assert created_b and created_t

        lease = await running_turn(store, mine, "t1")
        await store.append(lease, "t1", [NewItem("assistant", "secret")], [ev(3)])
        await store.update_session(mine, state={"n": 1})

        for other in (bobs, other_tenant):
            assert await store.list_items(other) == []
            assert await store.recent_items(other) == []
            assert await store.list_turns(other) == []
            assert await store.active_turns(other) == []
            assert await store.get_turn(other, "t1") is None
            assert await store.list_events(other, "t1") == []
            assert await store.lease_holder(other) is None
            # The other session's lease is free even though mine is held.
            assert await store.acquire_lease(other, "node-b", LONG_TTL) is not None
        bob_rec = await store.get_session(bobs)
        assert bob_rec is not None
        assert (bob_rec.agent, bob_rec.metadata, bob_rec.state) == ("helper", {"who": "bob"}, {})

        assert await store.delete_session(bobs) is True
        assert await store.delete_session(other_tenant) is True
        assert [i.content for i in await store.list_items(mine)] == ["hello", "secret"]
        assert await store.lease_holder(mine) == "node-a"
        assert (await store.get_session(mine)) is not None
        assert await store.sessions_needing_work() == [mine]

    async def test_list_sessions_only_the_owners_in_id_order(self, store: Store) -> None:
        for sid in ["b", "c", "a"]:
            await store.create_session(key(sid), "assistant")
        await store.create_session(key("0", owner="bob"), "assistant")
        await store.create_session(key("aa", tenant="other"), "assistant")
        listed = await store.list_sessions("acme", "alice")
        assert [r.key for r in listed] == [key("a"), key("b"), key("c")]
        assert [r.key.session_id for r in await store.list_sessions("acme", "bob")] == ["0"]
        assert await store.list_sessions("acme", "carol") == []

    async def test_list_sessions_pagination(self, store: Store) -> None:
        ids = [f"s-{n}" for n in range(23)] + ["a_b", "a.b", "Z", "s-1:x"]
        for sid in reversed(ids):
            await store.create_session(key(sid), "assistant")
        pages: list[list[str]] = []
        after: str | None = None
        while True:
            page = await store.list_sessions("acme", "alice", limit=5, after=after)
            if not page:
                break
            assert len(page) <= 5
            pages.append([r.key.session_id for r in page])
            after = page[-1].key.session_id
        seen = [sid for page in pages for sid in page]
        assert seen == sorted(ids)  # every id once, in order: no duplicates, no gaps
        assert all(len(p) == 5 for p in pages[:-1])
        first = await store.list_sessions("acme", "alice", limit=3)
        assert [r.key.session_id for r in first] == sorted(ids)[:3]

    async def test_update_session(self, store: Store) -> None:
        k = key()
        rec, _ = await store.create_session(k, "assistant", metadata={"a": 1, "b": 2})
        up = await store.update_session(k, metadata={"c": 3}, expected_revision=rec.revision)
        assert up.metadata == {"c": 3}  # replaced, not merged
        assert up.state == {}
        assert up.revision == rec.revision + 1
        assert up.agent == "assistant" and up.created_at == rec.created_at
        assert up.updated_at >= rec.updated_at

        up2 = await store.update_session(k, state={"step": 2, "nested": {"x": [1, 2]}})
        assert up2.state == {"step": 2, "nested": {"x": [1, 2]}}
        assert up2.metadata == {"c": 3}  # untouched field kept
        assert up2.revision == rec.revision + 2
        up3 = await store.update_session(k, state={"other": True})
        assert up3.state == {"other": True}

        with pytest.raises(Conflict):
            await store.update_session(k, metadata={"lost": True}, expected_revision=rec.revision)
        assert await store.get_session(k) == up3

    async def test_ttl_sets_expires_at(self, store: Store) -> None:
        k = key()
        before = time.time()
        rec, _ = await store.create_session(k, "assistant", ttl_seconds=60)
        assert rec.expires_at is not None
        assert before + 60 - CLOCK_SLACK <= rec.expires_at <= time.time() + 60 + CLOCK_SLACK
        moved = await store.update_session(k, ttl_seconds=3600)
        assert moved.expires_at is not None
        assert moved.expires_at >= rec.expires_at + 3000
        kept = await store.update_session(k, metadata={"x": 1})
        assert kept.expires_at == moved.expires_at
        assert (await store.get_session(k)) == kept

    async def test_an_idle_ttl_counts_from_the_latest_activity(self, store: Store) -> None:
        """With ``idle``, the TTL runs from the session's latest activity: every write that
        moves ``updated_at`` (a turn's items, an update) moves the expiry with it, until an
        update gives the session a TTL of its own. A plain TTL never moves."""
        k, plain = key("idle"), key("plain")
        rec, _ = await store.create_session(k, "assistant", ttl_seconds=600, idle=True)
        await store.create_session(plain, "assistant", ttl_seconds=600)
        assert rec.expires_at == pytest.approx(rec.created_at + 600, abs=CLOCK_SLACK)
        await asyncio.sleep(0.05)
        lease = await running_turn(store, k, "t1")
        other = await running_turn(store, plain, "p1")
        for held, turn_id in ((lease, "t1"), (other, "p1")):
            await store.append(held, turn_id, [NewItem("assistant", "hi")], [ev(3)])
        moved = await store.get_session(k)
        assert moved is not None and moved.expires_at is not None
        assert moved.updated_at >= rec.updated_at + 0.04
        assert moved.expires_at == pytest.approx(moved.updated_at + 600, abs=0.01)
        still = await store.get_session(plain)
        assert still is not None and still.expires_at == pytest.approx(
            still.created_at + 600, abs=CLOCK_SLACK
        )
        # An update without a TTL is activity too; one with a TTL makes it the session's own.
        await asyncio.sleep(0.02)
        touched = await store.update_session(k, metadata={"x": 1})
        assert touched.expires_at == pytest.approx(touched.updated_at + 600, abs=0.01)
        fixed = await store.update_session(k, ttl_seconds=60)
        assert fixed.expires_at == pytest.approx(fixed.updated_at + 60, abs=0.01)
        await asyncio.sleep(0.02)
        await store.append(lease, "t1", [NewItem("assistant", "more")], [ev(4)])
        after = await store.get_session(k)
        assert after is not None and after.expires_at == fixed.expires_at

    async def test_delete_session_removes_everything(self, store: Store) -> None:
        k = await new_session(store)
        lease = await running_turn(store, k, "t1")
        await store.append(lease, "t1", [NewItem("assistant", "hi")], [ev(3)])
        await store.enqueue_turn(k, turn_id="t2", input="next", policy="enqueue")
        assert await store.delete_session(k) is True
        assert await store.get_session(k) is None
        assert await store.get_turn(k, "t1") is None
        assert await store.get_turn(k, "t2") is None
        assert await store.list_events(k, "t1") == []
        assert await store.list_events(k, "t2") == []
        assert await store.sessions_needing_work() == []
        assert await store.delete_session(k) is False
        assert await store.list_sessions("acme", "alice") == []

        # Recreated under the same id, it starts empty.
        await new_session(store, k)
        assert await store.list_items(k) == []
        assert await store.list_turns(k) == []
        assert await store.active_turns(k) == []
        assert await store.get_turn(k, "t1") is None
        assert await store.list_events(k, "t1") == []
        assert await store.lease_holder(k) is None

    async def test_similar_ids_are_distinct_sessions(self, store: Store) -> None:
        # Characters with special meaning in LIKE patterns, regexes or prefixes must not merge.
        ids = ["a_b", "a.b", "aXb", "s-1", "s-10", "s-1:0", "S-1"]
        for n, sid in enumerate(ids):
            await store.create_session(key(sid), f"agent-{n}")
        for n, sid in enumerate(ids):
            rec = await store.get_session(key(sid))
            assert rec is not None and rec.agent == f"agent-{n}"

        lease = await running_turn(store, key("s-1"), "t1", text="for s-1")
        await store.end_turn(lease, "t1", TurnEnding("completed", "answered"), [], [ev(3)])
        for sid in ids:
            if sid != "s-1":
                assert await store.list_items(key(sid)) == []
                assert await store.list_turns(key(sid)) == []

        assert await store.delete_session(key("a_b")) is True
        assert await store.get_session(key("a.b")) is not None
        assert await store.get_session(key("aXb")) is not None
        assert await store.delete_session(key("s-1")) is True
        assert await store.get_session(key("s-10")) is not None
        assert await store.get_session(key("s-1:0")) is not None
        after = await store.list_sessions("acme", "alice", after="s-1")
        assert [r.key.session_id for r in after] == ["s-10", "s-1:0"]  # ':' sorts after '0'

    async def test_enqueue_on_an_expired_session_is_not_found(self, store: Store) -> None:
        k = key("short-lived")
        await store.create_session(k, "assistant", ttl_seconds=0.05)
        await asyncio.sleep(0.1)
        with pytest.raises(SessionNotFound):
            await store.enqueue_turn(k, turn_id="t1", input="late", policy="enqueue")
        assert await store.list_turns(k) == []

    async def test_sweep_removes_only_expired_idle_sessions(self, store: Store) -> None:
        now = time.time()
        idle, busy, leased, fresh, forever = (key(f"sweep-{n}") for n in range(5))
        for k in (idle, busy, leased):
            await store.create_session(k, "assistant", ttl_seconds=0.05)
        await store.create_session(fresh, "assistant", ttl_seconds=3600)
        await store.create_session(forever, "assistant")
        await store.enqueue_turn(busy, turn_id="t-busy", input="x", policy="enqueue")
        await acquire(store, leased, ttl=LONG_TTL)
        await asyncio.sleep(0.1)
        assert await store.sweep_expired(time.time()) == [idle]
        assert await store.get_session(idle) is None
        for kept in (busy, leased, fresh, forever):
            assert await store.get_session(kept) is not None
        assert await store.sweep_expired(now) == []

    async def test_list_sessions_newest_first_pages_without_gaps(self, store: Store) -> None:
        ids = [f"n{i}" for i in range(7)]
        for sid in ids:
            await store.create_session(key(sid), "assistant")
        await store.create_session(key("n9", owner="bob"), "assistant")
        for sid in ("n2", "n5"):  # touched last: the most recently active
            await asyncio.sleep(0.002)
            await store.update_session(key(sid), metadata={"touched": True})
        everything = await store.list_sessions("acme", "alice", order="newest", limit=100)
        order = [r.key.session_id for r in everything]
        assert order[:2] == ["n5", "n2"] and sorted(order) == ids
        by_rule = sorted(everything, key=lambda r: (-r.updated_at, r.key.session_id))
        assert order == [r.key.session_id for r in by_rule]
        seen: list[str] = []
        after: str | None = None
        while True:
            page = await store.list_sessions("acme", "alice", order="newest", limit=2, after=after)
            if not page:
                break
            seen += [r.key.session_id for r in page]
            after = rules.newest_cursor(page[-1])
        assert seen == order  # every session once, in order
        with pytest.raises(InvalidInput):
            await store.list_sessions("acme", "alice", order="newest", after="not-a-cursor")

    async def test_list_sessions_by_a_text_in_their_id(self, store: Store) -> None:
        for sid in ["alpha", "beta", "alphabet", "a%b", "a_b", "ALPHA"]:
            await store.create_session(key(sid), "assistant")
        await store.create_session(key("alpha-of-bob", owner="bob"), "assistant")

        async def found(text: str, order: SessionOrder = "id") -> list[str]:
            listed = await store.list_sessions("acme", "alice", contains=text, order=order)
            return sorted(r.key.session_id for r in listed)

        assert await found("alpha") == ["alpha", "alphabet"]  # ids are case-sensitive
        assert await found("alpha", "newest") == ["alpha", "alphabet"]
        # The text is text: not a LIKE pattern.
        assert await found("%") == ["a%b"]
        assert await found("_") == ["a_b"]
        assert await found("zzz") == []
        paged = await store.list_sessions("acme", "alice", contains="a", limit=2, after="a_b")
        assert [r.key.session_id for r in paged] == ["alpha", "alphabet"]

    async def test_session_stats_say_what_waits_and_which_agents_ran(self, store: Store) -> None:
        k = await new_session(store)
        stats = await store.session_stats(k)
        assert (stats.status, stats.agents, stats.awaiting_input) == ("idle", (), 0)
        lease = await running_turn(store, k, "t1", agent=AgentRef("triage", "f1"))
        assert (await store.session_stats(k)).status == "busy"
        done = TurnEnding("completed", "answered", "hi", True, agent="billing")
        await store.end_turn(lease, "t1", done, [NewItem("assistant", "hi")], [ev(3)])
        assert (await store.get_turn(k, "t1")).ran_by == "billing"  # type: ignore[union-attr]
        await running_turn(store, k, "t2", lease=lease, agent=AgentRef("writer", "f2"))
        d = rules.new_decision(k, "t2", NewDecision("c1", "approval", {}), time.time())
        await store.park_turn(lease, "t2", [], [], d, usage=Usage())
        stats = await store.session_stats(k)
        assert (stats.status, stats.awaiting_input, stats.active_turns) == ("awaiting_input", 1, 1)
        assert stats.agents == ("triage", "billing", "writer")
        assert stats.turns == 2
