"""What only the PostgreSQL backend promises: durable state across pools, migrations applied once
however many processes start together, fencing between processes, and driver errors that never
leak. These tests skip without ``TETHER_TEST_POSTGRES_URL`` (see tests/conformance/postgres_db.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager

import asyncpg  # type: ignore[import-untyped]
import pytest

from tether.errors import (
    ConfigError,
    InvalidInput,
    LimitExceeded,
    SessionNotFound,
    StaleLease,
    StoreError,
)
from tether.records import Lease, NewEvent, NewItem, PrincipalLimits, SessionKey, TurnEnding
from tether.store import PostgresStore, open_store_url
from tether.store.postgres.migrations import MIGRATIONS

KEY = SessionKey("acme", "alice", "s1")


async def query(url: str, sql: str) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


@asynccontextmanager
async def opened(*stores: PostgresStore) -> AsyncIterator[None]:
    try:
        await asyncio.gather(*(s.open() for s in stores))
        yield
    finally:
        for s in stores:
            await s.close()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (it was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_open_store_url_gives_a_postgres_store(postgres_url: str) -> None:
    store = open_store_url(postgres_url)
    assert isinstance(store, PostgresStore)
    other = open_store_url(postgres_url.replace("postgresql://", "postgres://", 1))
    assert isinstance(other, PostgresStore)
    await store.open()
    try:
        await store.ping()
    finally:
        await store.close()


async def test_the_url_sets_the_pool_size_and_asyncpg_never_sees_it(postgres_url: str) -> None:
    sep = "&" if "?" in postgres_url else "?"
    store = PostgresStore(f"{postgres_url}{sep}pool_size=2")
    assert "pool_size" not in store.url  # it would become a server setting PostgreSQL refuses
    await store.open()
    try:
        # Four calls at once on two connections: the pool never opens a third.
        await asyncio.gather(*(store._fetchval("SELECT pg_sleep(0.1)") for _ in range(4)))
        rows = await query(
            postgres_url,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'SELECT pg_sleep(0.1)%'",
        )
        assert rows == [(2,)]
    finally:
        await store.close()
    for bad in ("0", "x", "-3", "100001"):
        with pytest.raises(ConfigError, match="pool_size"):
            PostgresStore(f"{postgres_url}{sep}pool_size={bad}")


async def test_a_call_cancelled_mid_transaction_leaves_its_connection_clean(
    postgres_url: str,
) -> None:
    # The pool's reset is a no-op (no round trip per release); asyncpg still ends what a
    # cancelled call left open before the one connection of this pool serves the next call.
    sep = "&" if "?" in postgres_url else "?"
    store = PostgresStore(f"{postgres_url}{sep}pool_size=1")
    async with opened(store):
        await store.create_session(KEY, "assistant")

        async def stuck() -> None:
            async with store._tx() as conn:
                await conn.execute("UPDATE sessions SET agent = 'changed'")
                await conn.execute("SELECT pg_sleep(30)")

        task = asyncio.create_task(stuck())
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(10):
            record = await store.get_session(KEY)
        assert record is not None and record.agent == "assistant"
        updated = await store.update_session(KEY, state={"after": True})
        assert updated.state == {"after": True} and updated.agent == "assistant"


async def test_data_survives_close_and_reopen(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    await store.open()
    await store.create_session(KEY, "assistant", metadata={"topic": "tax", "n": [1, 2.5]})
    await store.update_session(KEY, state={"step": 3})
    await store.enqueue_turn(KEY, turn_id="t1", input="hello", policy="enqueue")
    lease = await store.acquire_lease(KEY, "node-a", 0.05)
    assert lease is not None
    await store.start_turn(
        lease, "t1", [NewItem("user", "hello")], [NewEvent(2, "turn.started", {})]
    )
    await store.end_turn(
        lease,
        "t1",
        TurnEnding("completed", "answered", output="hi", complete=True),
        [NewItem("assistant", "hi", meta={"lang": "en"})],
        [NewEvent(3 + n, "message.delta", {"text": w}) for n, w in enumerate(["h", "i"])],
    )
    await store.enqueue_turn(KEY, turn_id="t2", input="more", policy="enqueue")
    session = await store.get_session(KEY)
    items = await store.list_items(KEY)
    turns = await store.list_turns(KEY)
    events = await store.list_events(KEY, "t1")
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError):
        await store.get_session(KEY)

    reopened = PostgresStore(postgres_url)
    async with opened(reopened):
        assert await reopened.get_session(KEY) == session
        assert await reopened.list_items(KEY) == items
        assert await reopened.list_turns(KEY) == turns
        assert await reopened.list_events(KEY, "t1") == events
        assert await reopened.sessions_needing_work() == [KEY]
        # The fencing counter is durable too: a later owner's token is still higher.
        await asyncio.sleep(0.15)
        later = await reopened.acquire_lease(KEY, "node-b", 30)
        assert later is not None and later.token > lease.token


async def test_migrations_are_applied_once_by_concurrent_openers(postgres_url: str) -> None:
    expected = [(version,) for version, _ in MIGRATIONS]
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    # Two servers starting together on an empty schema: both open, neither fails on the
    # other's tables, and every migration is recorded once.
    async with opened(a, b):
        await a.create_session(KEY, "assistant")
        assert await b.get_session(KEY) is not None
    assert await query(postgres_url, "SELECT version FROM schema_version ORDER BY 1") == expected

    for _ in range(2):
        again = PostgresStore(postgres_url)
        async with opened(again):
            assert await again.get_session(KEY) is not None
    assert await query(postgres_url, "SELECT version FROM schema_version ORDER BY 1") == expected


async def test_two_stores_share_state_and_fence_each_other(postgres_url: str) -> None:
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    async with opened(a, b):
        await a.create_session(KEY, "assistant")
        assert await b.get_session(KEY) is not None
        await b.enqueue_turn(KEY, turn_id="t1", input="hello", policy="enqueue")

        lease_a = await a.acquire_lease(KEY, "node-a", 0.05)
        assert lease_a is not None
        assert await b.acquire_lease(KEY, "node-b", 30) is None
        assert await b.lease_holder(KEY) == "node-a"
        await a.start_turn(
            lease_a, "t1", [NewItem("user", "hello")], [NewEvent(2, "turn.started", {})]
        )
        await a.append(lease_a, "t1", [NewItem("tool_call", call_id="c1", tool_name="f")], [])
        assert [i.kind for i in await b.list_items(KEY)] == ["user", "tool_call"]

        await asyncio.sleep(0.15)
        lease_b = await b.acquire_lease(KEY, "node-b", 30)
        assert lease_b is not None and lease_b.token > lease_a.token
        assert await a.lease_holder(KEY) == "node-b"
        assert await a.acquire_lease(KEY, "node-a", 30) is None

        before = await b.list_items(KEY)
        with pytest.raises(StaleLease):
            await a.append(lease_a, "t1", [NewItem("assistant", "zombie")], [])
        with pytest.raises(StaleLease):
            await a.end_turn(lease_a, "t1", TurnEnding("completed", "answered"), [], [])
        assert await a.renew_leases([lease_a], 30) == []
        assert await b.list_items(KEY) == before

        (recovered,) = await b.recover(lease_b)
        assert (recovered.status, recovered.reason) == ("failed", "owner_lost")
        turn = await a.get_turn(KEY, "t1")
        assert turn is not None and turn.status == "failed"
        assert [i.kind for i in await a.list_items(KEY)] == ["user", "tool_call", "tool_result"]


async def test_racing_acquirers_on_two_stores_have_one_winner(postgres_url: str) -> None:
    # Ten connections each, opened beforehand: the twenty UPDATEs really do run at once.
    a, b = (PostgresStore(postgres_url, min_size=10, max_size=10) for _ in range(2))
    async with opened(a, b):
        await a.create_session(KEY, "assistant")
        start = asyncio.Event()

        async def contend(n: int) -> Lease | None:
            store = a if n % 2 else b
            await start.wait()
            return await store.acquire_lease(KEY, f"node-{n}", 30)

        tasks = [asyncio.create_task(contend(n)) for n in range(20)]
        await asyncio.sleep(0.05)  # let every task reach the start line
        start.set()
        results = await asyncio.gather(*tasks)
        winners = [lease for lease in results if lease is not None]
        assert len(winners) == 1
        (winner,) = winners
        assert await a.lease_holder(KEY) == winner.owner
        assert await b.lease_holder(KEY) == winner.owner
        # The winner's token is the current one: it renews, and fences out any other.
        renewed = await b.renew_leases([winner], 30)
        assert [(r.owner, r.token) for r in renewed] == [(winner.owner, winner.token)]
        loser = Lease(KEY, "node-x", winner.token - 1, winner.expires_at)
        with pytest.raises(StaleLease):
            await a.append(loser, "t1", [], [])


async def test_a_stale_writer_racing_a_new_owner_never_writes_after_it(postgres_url: str) -> None:
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    async with opened(a, b):
        await a.create_session(KEY, "assistant")
        await a.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        old = await a.acquire_lease(KEY, "node-a", 0.2)
        assert old is not None
        await a.start_turn(old, "t1", [NewItem("user", "x")], [])

        async def zombie() -> int:
            """A paused owner that never learnt its lease expired: it writes until fenced."""
            written = 0
            while True:
                try:
                    await a.append(old, "t1", [NewItem("assistant", str(written))], [])
                except StaleLease:
                    return written
                written += 1

        writer = asyncio.create_task(zombie())
        new = None
        while new is None:
            await asyncio.sleep(0.01)
            new = await b.acquire_lease(KEY, "node-b", 30)
        at_takeover = await b.list_items(KEY, limit=100_000)
        written = await writer
        assert written > 0
        # Every write of the old owner committed before the takeover; none after it.
        assert len(at_takeover) == 1 + written
        assert await b.list_items(KEY, limit=100_000) == at_takeover


async def test_racing_writers_serialise_their_item_seqs(postgres_url: str) -> None:
    a, b = PostgresStore(postgres_url), PostgresStore(postgres_url)
    async with opened(a, b):
        await a.create_session(KEY, "assistant")
        await a.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        lease = await a.acquire_lease(KEY, "node-a", 30)
        assert lease is not None
        await a.start_turn(lease, "t1", [NewItem("user", "x")], [])
        await asyncio.gather(
            *(
                (a if n % 2 else b).append(lease, "t1", [NewItem("assistant", str(n))] * 3, [])
                for n in range(10)
            )
        )
        items = await b.list_items(KEY, limit=1000)
        assert [i.seq for i in items] == list(range(1, 32))


async def test_racing_admissions_of_one_owner_never_pass_its_bound(postgres_url: str) -> None:
    # Twenty turns on twenty idle sessions of one owner, at once from two pools, with room for
    # five running: the owner's lock is taken last in the admission, and five get in.
    a, b = (PostgresStore(postgres_url, min_size=10, max_size=10) for _ in range(2))
    limits = PrincipalLimits(running_turns=5, queued_turns=0)
    keys = [SessionKey("acme", "alice", f"r{n}") for n in range(20)]
    async with opened(a, b):
        for k in keys:
            await a.create_session(k, "assistant")
        await a.enqueue_turn(keys[0], turn_id="first", input="x", policy="enqueue")
        start = asyncio.Event()

        async def contend(n: int) -> bool:
            store = a if n % 2 else b
            await start.wait()
            try:
                await store.enqueue_turn(
                    keys[n], turn_id=f"t{n}", input="x", policy="enqueue", limits=limits
                )
            except LimitExceeded:
                return False
            return True

        tasks = [asyncio.create_task(contend(n)) for n in range(1, 20)]
        await asyncio.sleep(0.05)
        start.set()
        admitted = sum(await asyncio.gather(*tasks))
        assert admitted == 4  # "first" holds one of the five
        # Behind a busy session a turn needs room among the queued ones: there is none.
        with pytest.raises(LimitExceeded):
            await b.enqueue_turn(keys[0], turn_id="q", input="x", policy="enqueue", limits=limits)
        # A refused admission wrote nothing, not even its turn's seq.
        turns = [t for k in keys for t in await a.list_turns(k)]
        assert len(turns) == 5
        again = await a.enqueue_turn(keys[0], turn_id="q2", input="x", policy="enqueue")
        assert again.seq == 2


async def test_an_owner_whose_turns_are_not_bounded_admits_without_the_owner_lock(
    postgres_url: str,
) -> None:
    # The owner's lock is held by each admission until it commits (a WAL flush), and every
    # admission of the owner's turns in any process waits for it. Bounds that say nothing of
    # turns (only of sessions, or none) count nothing, so they need no lock.
    store = PostgresStore(postgres_url)
    keys = [SessionKey("acme", "alice", f"free{n}") for n in range(3)]
    async with opened(store):
        for k in keys:
            await store.create_session(k, "assistant")
        holder = await asyncpg.connect(postgres_url)
        try:
            lock = holder.transaction()
            await lock.start()
            await holder.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 7))",
                "acme",
                "alice",
            )
            for turn_id, k, limits in (
                ("a", keys[0], PrincipalLimits(sessions=5)),
                ("b", keys[1], PrincipalLimits()),
            ):
                turn = await asyncio.wait_for(
                    store.enqueue_turn(
                        k, turn_id=turn_id, input="x", policy="enqueue", limits=limits
                    ),
                    5,
                )
                assert turn.status == "queued"
            taken, lease, _ = await asyncio.wait_for(
                store.enqueue_turn_taken(
                    keys[2],
                    owner="node-a",
                    ttl=30,
                    turn_id="c",
                    input="x",
                    policy="enqueue",
                    items=[NewItem("user", "x")],
                    events=[NewEvent(2, "turn.started", {"turn_id": "c"})],
                    limits=PrincipalLimits(sessions=5),
                ),
                5,
            )
            assert taken.status == "running" and lease is not None
            # A bound on running turns counts them, under the lock: it waits for the holder.
            bounded = asyncio.create_task(
                store.enqueue_turn(
                    keys[0],
                    turn_id="d",
                    input="x",
                    policy="enqueue",
                    limits=PrincipalLimits(running_turns=5),
                )
            )
            await asyncio.sleep(0.3)
            assert not bounded.done()
            await lock.commit()
            assert (await asyncio.wait_for(bounded, 5)).status == "queued"
        finally:
            await holder.close()


async def test_the_previous_releases_session_function_still_makes_sessions(
    postgres_url: str,
) -> None:
    # Migration 21 added the idle TTL to tether_create_session as a new overload; a process of
    # the previous release calls the 9-argument one, which makes sessions without it.
    store = PostgresStore(postgres_url)
    async with opened(store):
        rows = await query(
            postgres_url,
            "SELECT outcome, r_session FROM tether_create_session('acme', 'alice', 'old',"
            " 'assistant', '{}', 0, NULL, 1, 10)",
        )
        assert rows == [("created", "old")]
        made = await store.get_session(SessionKey("acme", "alice", "old"))
        assert made is not None and made.expires_at is None
        idle = await query(postgres_url, "SELECT idle_ttl FROM sessions WHERE session_id = 'old'")
        assert idle == [(None,)]


async def test_a_ttl_the_previous_release_sets_on_an_idle_session_is_its_own(
    postgres_url: str,
) -> None:
    # As on SQLite: the previous release's UPDATE, which knows nothing of idle_ttl, gives the
    # session a TTL of its own; later activity does not move it.
    store = PostgresStore(postgres_url)
    async with opened(store):
        await store.create_session(KEY, "assistant", ttl_seconds=1000, idle=True)
        until = time.time() + 60
        await query(
            postgres_url,
            f"UPDATE sessions SET expires_at = {until!r}, updated_at = {time.time()!r},"
            " revision = revision + 1 WHERE session_id = 's1'",
        )
        record = await store.get_session(KEY)
        assert record is not None and record.expires_at == pytest.approx(until, abs=0.01)
        await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
        lease = await store.acquire_lease(KEY, "node-a", 30)
        assert lease is not None
        await store.start_turn(lease, "t1", [NewItem("user", "x")], [])
        after = await store.get_session(KEY)
        assert after is not None and after.expires_at == pytest.approx(until, abs=0.01)
        assert after.updated_at > record.updated_at


async def back_to_release_12(url: str) -> None:
    """The schema as release 12 left it: no busy_sessions, no trigger, no session function,
    no lease function, no admission that starts (under a lease held, or taken), no index of
    expiring sessions, no idle TTL, no ending that gives the lease up. Opening a store then
    runs migrations 13 on again (their functions are made whole again by them)."""
    for sql in (
        "DROP FUNCTION tether_end_release",
        "DROP FUNCTION tether_enqueue(text, text, text, text, text, text, double precision,"
        " text, text, text, text, bigint, boolean, bigint, bigint, bigint, text, text,"
        " double precision)",
        "DROP FUNCTION tether_acquire",
        "DROP TRIGGER sessions_idle_expiry ON sessions",
        "DROP FUNCTION tether_idle_expiry()",
        "ALTER TABLE sessions DROP COLUMN idle_ttl",
        "DROP FUNCTION tether_create_session(text, text, text, text, text, double precision,"
        " double precision, bigint, bigint, double precision)",
        "DROP FUNCTION tether_create_session(text, text, text, text, text, double precision,"
        " double precision, bigint, bigint)",
        "DROP FUNCTION tether_enqueue_started",
        "DROP FUNCTION tether_enqueue_taken",
        "DROP TRIGGER turns_count_busy ON turns",
        "DROP FUNCTION tether_count_busy()",
        "DROP TABLE busy_sessions",
        "DROP INDEX sessions_expiring",
        "DELETE FROM schema_version WHERE version >= 13",
    ):
        await query(url, sql)


async def test_an_upgraded_database_counts_the_turns_it_already_had(postgres_url: str) -> None:
    # Migration 13 moves the owner's count to busy_sessions: on a database that has queued and
    # running turns already, the backfill must count them, or the first admissions after an
    # upgrade would pass the owner's bound.
    store = PostgresStore(postgres_url)
    keys = [SessionKey("acme", "alice", f"u{n}") for n in range(3)]
    async with opened(store):
        for n, k in enumerate(keys):
            await store.create_session(k, "assistant")
            for m in range(n + 1):
                await store.enqueue_turn(k, turn_id=f"u{n}-{m}", input="x", policy="enqueue")
        lease = await store.acquire_lease(keys[2], "node-a", 30)
        assert lease is not None
        await store.start_turn(lease, "u2-0", [], [])
        before = await query(postgres_url, "SELECT session_pk, live FROM busy_sessions ORDER BY 1")
    await back_to_release_12(postgres_url)
    store = PostgresStore(postgres_url)
    async with opened(store):
        after = await query(postgres_url, "SELECT session_pk, live FROM busy_sessions ORDER BY 1")
        assert [live for _, live in after] == [1, 2, 3] and after == before
        limits = PrincipalLimits(running_turns=3, queued_turns=4)
        idle = SessionKey("acme", "alice", "idle")
        await store.create_session(idle, "assistant")
        with pytest.raises(LimitExceeded):  # three busy sessions: no room for a fourth
            await store.enqueue_turn(idle, turn_id="i1", input="x", policy="enqueue", limits=limits)
        with pytest.raises(LimitExceeded):  # 6 under way, 3 of them first: 3 queued, one more
            for m in range(2):
                await store.enqueue_turn(
                    keys[0], turn_id=f"q{m}", input="x", policy="enqueue", limits=limits
                )
        assert [t.id for t in await store.list_turns(keys[0])] == ["u0-0", "q0"]


async def test_a_turn_ended_by_the_previous_release_during_the_upgrade_is_not_counted(
    postgres_url: str,
) -> None:
    # A process of the previous release ends a turn in a transaction still open when a new
    # process migrates: the migration waits for it, so the count never holds a turn that was
    # ended (which would refuse the owner's admissions for good).
    store = PostgresStore(postgres_url)
    async with opened(store):
        await store.create_session(KEY, "assistant")
        await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue")
    await back_to_release_12(postgres_url)
    old = await asyncpg.connect(postgres_url)
    try:
        ending = old.transaction()
        await ending.start()
        await old.execute("UPDATE turns SET status = 'cancelled', ended_at = 1 WHERE id = 't1'")
        store = PostgresStore(postgres_url)
        upgrading = asyncio.create_task(store.open())
        await asyncio.sleep(0.5)  # the migration is under way, waiting for the old writer
        await ending.commit()
    finally:
        await old.close()
    await upgrading
    try:
        assert await query(postgres_url, "SELECT * FROM busy_sessions") == []
        other = SessionKey("acme", "alice", "s2")
        await store.create_session(other, "assistant")
        await store.enqueue_turn(
            other,
            turn_id="n1",
            input="x",
            policy="enqueue",
            limits=PrincipalLimits(running_turns=1),
        )
    finally:
        await store.close()


async def test_a_turn_queued_on_a_session_held_elsewhere_is_announced_to_the_holder(
    postgres_url: str,
) -> None:
    # The notice names the session; one whose key could not be told apart in a notice (or
    # would not fit one) is announced without it, and the holder looks at all it holds.
    store = PostgresStore(postgres_url)
    heard: list[SessionKey | None] = []
    listening = asyncio.Event()
    async with opened(store):
        odd = SessionKey("acme", "a\x1fb", "s1")  # no principal is named so; the store takes it
        for key in (KEY, odd):
            await store.create_session(key, "assistant")
            assert await store.acquire_lease(key, "node-a", 30) is not None
        listener = asyncio.create_task(
            store.listen_cancels(lambda _: None, listening.set, heard.append)
        )
        try:
            await asyncio.wait_for(listening.wait(), 10)
            await store.enqueue_turn(KEY, turn_id="t1", input="x", policy="enqueue", by="node-a")
            await store.enqueue_turn(KEY, turn_id="t2", input="x", policy="enqueue", by="node-b")
            await store.enqueue_turn(odd, turn_id="t3", input="x", policy="enqueue", by="node-b")
            await wait_for_count(heard, 2)
            assert heard == [KEY, None]  # none for the holder's own turn
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener


async def wait_for_count(items: list[SessionKey | None], n: int) -> None:
    async with asyncio.timeout(10):
        while len(items) < n:  # noqa: ASYNC110 - notifications come on the listener's own time
            await asyncio.sleep(0.01)


async def test_ping_and_open_raise_store_error_when_unreachable() -> None:
    store = PostgresStore(f"postgresql://nobody@127.0.0.1:{closed_port()}/db", connect_timeout=2)
    with pytest.raises(StoreError):
        await store.open()
    with pytest.raises(StoreError):
        await store.ping()
    with pytest.raises(StoreError):
        await store.get_session(KEY)
    await store.close()


async def test_a_missing_database_is_a_store_error(postgres_database: str) -> None:
    url = postgres_database.rsplit("/", 1)[0] + "/tether_no_such_database"
    with pytest.raises(StoreError):
        await PostgresStore(url).open()


async def test_lost_connections_are_replaced(postgres_url: str) -> None:
    # Unknown URL parameters are server settings: this one tells the pool's sessions apart.
    name = f"tether-{secrets.token_hex(4)}"
    store = PostgresStore(f"{postgres_url}&application_name={name}", min_size=2, max_size=2)
    async with opened(store):
        await store.create_session(KEY, "assistant")
        # Every connection of the pool dies (a server restart, a failover, an idle timeout).
        killed = await query(
            postgres_url,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            f" WHERE application_name = '{name}'",
        )
        assert killed == [(True,), (True,)]
        for _ in range(50):  # the driver notices the closed sockets on its own
            try:
                await store.ping()
                break
            except StoreError:
                await asyncio.sleep(0.02)
        assert await store.get_session(KEY) is not None


async def test_text_postgresql_cannot_hold_is_invalid_input(postgres_url: str) -> None:
    store = PostgresStore(postgres_url)
    async with opened(store):
        with pytest.raises(InvalidInput):
            await store.create_session(SessionKey("acme", "alice", "nul\x00"), "assistant")
        # JSON is stored as text: a NUL inside a value is escaped and round-trips.
        rec, _ = await store.create_session(KEY, "assistant", metadata={"a": "x\x00y"})
        assert rec.metadata == {"a": "x\x00y"}
        assert await store.get_session(KEY) == rec
        # What the HTTP schema refuses first still gets words of ours, not the driver's, from
        # the store itself (the Python API reaches it directly).
        with pytest.raises(InvalidInput, match=r"^text must not contain NUL characters$"):
            await store.enqueue_turn(KEY, turn_id="t-nul", input="a\x00b", policy="enqueue")
        with pytest.raises(InvalidInput, match=r"^a number is out of range"):
            await store.update_session(KEY, metadata={}, expected_revision=2**63 + 5)
        assert await store.list_turns(KEY) == []


async def test_session_ids_sort_by_bytes_whatever_the_locale(postgres_url: str) -> None:
    # The test database's own collation is ICU English where the server has ICU (see
    # postgres_db.py), in which these ids sort differently: the store must ask for bytes.
    store = PostgresStore(postgres_url)
    ids = ["a", "B", "_", "a.b", "a_b", "A-1", "z", "Z", "0", "s-1:0", "s-10", "é", "ß"]
    async with opened(store):
        for sid in ids:
            await store.create_session(SessionKey("acme", "alice", sid), "assistant")
        listed = await store.list_sessions("acme", "alice", limit=100)
        assert [r.key.session_id for r in listed] == sorted(ids)
        after = await store.list_sessions("acme", "alice", after="a")
        assert [r.key.session_id for r in after] == sorted(i for i in ids if i > "a")
    columns = await query(
        postgres_url,
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'sessions'"
        " AND table_schema = current_schema() AND column_name IN ('tenant', 'owner',"
        " 'session_id') AND collation_name IS DISTINCT FROM 'C'",
    )
    assert columns == []


async def test_a_cancel_request_of_an_older_release_still_cancels_and_blocks_no_other(
    postgres_url: str,
) -> None:
    # A request another release wrote ("interrupt by turn …") ends its turn all the same and
    # does not keep the other requests from being read (rolling upgrades of a cluster).
    store = PostgresStore(postgres_url)
    async with opened(store):
        other = SessionKey("acme", "alice", "s2")
        for key, turn_id in ((KEY, "t1"), (other, "t2")):
            await store.create_session(key, "assistant")
            await store.enqueue_turn(key, turn_id=turn_id, input="x", policy="enqueue")
            lease = await store.acquire_lease(key, "node-a", 30)
            assert lease is not None
            await store.start_turn(lease, turn_id, [], [])
        assert await store.request_cancel(other, "t2", "cancelled", "cancelled")
        old = '{"status": "interrupted", "reason": "interrupt by turn t_9"}'
        await query(postgres_url, f"UPDATE turns SET cancel_request = '{old}' WHERE id = 't1'")
        assert await store.cancel_requests(["t1", "t2"]) == {
            "t1": ("interrupted", "interrupt"),
            "t2": ("cancelled", "cancelled"),
        }


async def test_making_a_session_holds_the_owner_lock_over_no_round_trip(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every admission of the owner's turns takes the owner's lock: a creation that held it
    # from one round trip to the next (three of them, before migration 15) held them all up
    # for as long as this process's event loop took to come back between them.
    held: list[int] = []

    async def advisory_locks() -> None:
        rows = await query(
            postgres_url,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )
        held.append(int(str(rows[0][0])))

    store = PostgresStore(postgres_url)
    async with opened(store):
        with statements_sent(monkeypatch, after=advisory_locks) as statements:
            record, created = await store.create_session(
                SessionKey("acme", "alice", "locks"), "assistant", max_sessions=10
            )
        assert created and record.agent == "assistant"
        with pytest.raises(LimitExceeded):
            await store.create_session(
                SessionKey("acme", "alice", "one-too-many"), "assistant", max_sessions=1
            )
    assert statements and held == [0] * len(statements)


async def test_recovering_under_a_new_lease_with_nothing_running_is_one_read(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every session a worker takes up is recovered first: most often nothing was left running,
    # and that is one read (it was a transaction locking the session's row: four round trips
    # and a WAL flush per lease).
    store = PostgresStore(postgres_url)
    key = SessionKey("acme", "alice", "recovers")
    async with opened(store):
        await store.create_session(key, "assistant")
        lease = await store.acquire_lease(key, "node-a", 30)
        assert lease is not None
        with statements_sent(monkeypatch) as statements:
            assert await store.recover(lease) == []
        assert len(statements) == 1 and "FOR UPDATE" not in statements[0]
        # A turn left running is still ended, under the next lease.
        await store.enqueue_turn(key, turn_id="left", input="x", policy="enqueue")
        await store.start_turn(lease, "left", [], [])
        await store.release_lease(lease)
        again = await store.acquire_lease(key, "node-b", 30)
        assert again is not None
        with pytest.raises(StaleLease):
            await store.recover(lease)
        assert [t.id for t in await store.recover(again)] == ["left"]


async def test_a_new_lease_reads_its_history_in_one_statement(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker reads the session's recent history once per lease: one statement that finds
    # the session by its key (it was a look-up of the session's pk first, then the items).
    store = PostgresStore(postgres_url)
    key = SessionKey("acme", "alice", "history")
    async with opened(store):
        await store.create_session(key, "assistant")
        await store.enqueue_turn(key, turn_id="h1", input="hello", policy="enqueue")
        lease = await store.acquire_lease(key, "node-a", 30)
        assert lease is not None
        await store.start_turn(lease, "h1", [NewItem("user", "hello")], [])
        with statements_sent(monkeypatch) as statements:
            assert [i.content for i in await store.recent_items(key)] == ["hello"]
        assert len(statements) == 1
        # An empty answer is told apart: no items yet, or no session at all.
        assert await store.recent_items(key, before_seq=1) == []
        with pytest.raises(SessionNotFound):
            await store.recent_items(SessionKey("acme", "alice", "nobody"))


@contextlib.contextmanager
def statements_sent(
    monkeypatch: pytest.MonkeyPatch, *, after: Callable[[], Awaitable[None]] | None = None
) -> Iterator[list[str]]:
    """The SQL of every statement the store sends to PostgreSQL meanwhile; ``after`` runs
    once each has been answered (its own statements are not counted)."""
    statements: list[str] = []
    looking = False
    Connection = asyncpg.connection.Connection
    originals = {
        name: getattr(Connection, name) for name in ("execute", "fetch", "fetchrow", "fetchval")
    }

    def counted(name: str) -> object:
        async def call(self: object, sql: str, *args: object, **kwargs: object) -> object:
            nonlocal looking
            if looking:
                return await originals[name](self, sql, *args, **kwargs)
            statements.append(sql)
            result = await originals[name](self, sql, *args, **kwargs)
            if after is not None:
                looking = True
                try:
                    await after()
                finally:
                    looking = False
            return result

        return call

    with monkeypatch.context() as patched:
        for name in originals:
            patched.setattr(Connection, name, counted(name))
        yield statements


async def test_a_lease_taken_while_a_start_commits_sees_the_start(postgres_url: str) -> None:
    """A lease says whether a turn was left running, and the session's queue, from the same
    round trip that takes it (migration 16). A start holding the session's row as the lease is
    asked for must be seen once it commits: the lease's statement waits for the row, and looks
    at the turns after it has it (a RETURNING subquery would have looked from before the wait,
    seen nothing running, and a dead owner's turn would have stayed running for good)."""
    store = PostgresStore(postgres_url)
    key = SessionKey("acme", "alice", "racing-start")
    async with opened(store):
        await store.create_session(key, "assistant")
        await store.enqueue_turn(key, turn_id="t1", input="x", policy="enqueue")
        first = await store.acquire_lease(key, "node-a", 0.2)
        assert first is not None and first.queue == ("t1",) and first.left_running is False
        conn = await asyncpg.connect(postgres_url)
        try:
            tx = conn.transaction()
            await tx.start()
            # node-a's start, as its fenced write makes it: the session's row first.
            await conn.execute(
                "SELECT 1 FROM sessions WHERE session_id = $1 FOR UPDATE", key.session_id
            )
            await conn.execute("UPDATE turns SET status = 'running' WHERE id = 't1'")
            await asyncio.sleep(0.3)  # node-a's lease runs out meanwhile
            taking = asyncio.create_task(store.acquire_lease(key, "node-b", 30))
            await asyncio.sleep(0.3)
            assert not taking.done()  # it waits for the row
            await tx.commit()
            lease = await asyncio.wait_for(taking, 10)
        finally:
            await conn.close()
        assert lease is not None and lease.owner == "node-b"
        assert lease.left_running is True and lease.queue == ("t1",)
        assert [t.id for t in await store.recover(lease)] == ["t1"]
