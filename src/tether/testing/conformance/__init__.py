"""The store conformance suite: the behaviour every :class:`~tether.store.protocol.Store` must have.

One suite, run against every backend (DESIGN §5). The in-memory store is the runnable spec;
a backend conforms when all of these tests pass against it.

The suite is cut by capability, one class each, so a failure names what broke:

* :class:`SessionsConformance`: sessions by key: create, get, list, update, expiry, delete;
* :class:`HistoryConformance`: a session's items: seqs, pagination, recent items, summaries;
* :class:`TurnsConformance`: enqueue, the busy policies, the queue bound, start, append;
* :class:`EndingsConformance`: what each way of ending does to a turn's items;
* :class:`LeasesConformance`: acquire, renew, release, take over; tokens only grow;
* :class:`FencingConformance`: stale or clashing writes change nothing; recovery;
* :class:`EventsConformance`: a turn's events, resuming them, cancel requests;
* :class:`RecallConformance`: memory records: round trips, compare-and-set, isolation;
* :class:`SearchConformance`: vector versions and snapshots, lexical search;
* :class:`DocumentsConformance`: knowledge documents and their chunks; storage used per user;
* :class:`ForgetConformance`: forgetting a user;
* :class:`IdempotencyConformance`: one idempotency key, one turn;
* :class:`LimitsConformance`: per-principal bounds on turns and sessions;
* :class:`LifecyclesConformance`: session memory dies with its session; a turn's memory
  commits with its ending;
* :class:`DecisionsConformance`: turns parked on a decision: decided once, expired, resumed,
  ended while parked.

:class:`StoreConformance` is all of them together. How a backend author uses it: subclass it
(or only the capability classes the backend implements) in a test module pytest collects, and
provide a fixture named ``store`` that yields an **opened, empty** store, fresh for every test,
and closes it afterwards::

    from collections.abc import AsyncIterator
    from pathlib import Path

    import pytest

    from tether.store.protocol import Store
    from tether.testing.conformance import StoreConformance


    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
            s = MyStore(tmp_path / "db")
            await s.open()
            try:
                yield s
            finally:
                await s.close()

The tests are plain ``async def`` methods and the fixture is an async generator, so run them
with pytest-asyncio in ``asyncio_mode = "auto"`` (in strict mode, set
``pytestmark = pytest.mark.asyncio`` on the subclass and declare the fixture with
``pytest_asyncio.fixture``). Lease and session expiry are exercised with real time: leases of
50 ms and sleeps of 150 ms, so the store must compare expiry against a clock that moves with
the test process.

This package imports only pytest and tether, so it can ship inside tether.
"""

from __future__ import annotations

from tether.testing.conformance.decisions import DecisionsConformance
from tether.testing.conformance.documents import DocumentsConformance
from tether.testing.conformance.endings import EndingsConformance
from tether.testing.conformance.events import EventsConformance
from tether.testing.conformance.fencing import FencingConformance
from tether.testing.conformance.forget import ForgetConformance
from tether.testing.conformance.history import HistoryConformance
from tether.testing.conformance.idempotency import IdempotencyConformance
from tether.testing.conformance.leases import LeasesConformance
from tether.testing.conformance.lifecycles import LifecyclesConformance
from tether.testing.conformance.limits import LimitsConformance
from tether.testing.conformance.recall import RecallConformance
from tether.testing.conformance.search import SearchConformance
from tether.testing.conformance.sessions import SessionsConformance
from tether.testing.conformance.turns import TurnsConformance

__all__ = [
    "DecisionsConformance",
    "DocumentsConformance",
    "EndingsConformance",
    "EventsConformance",
    "FencingConformance",
    "ForgetConformance",
    "HistoryConformance",
    "IdempotencyConformance",
    "LeasesConformance",
    "LifecyclesConformance",
    "LimitsConformance",
    "RecallConformance",
    "SearchConformance",
    "SessionsConformance",
    "StoreConformance",
    "TurnsConformance",
]


class StoreConformance(
    SessionsConformance,
    HistoryConformance,
    TurnsConformance,
    EndingsConformance,
    LeasesConformance,
    FencingConformance,
    EventsConformance,
    RecallConformance,
    SearchConformance,
    DocumentsConformance,
    ForgetConformance,
    LifecyclesConformance,
    LimitsConformance,
    IdempotencyConformance,
    DecisionsConformance,
):
    """Every capability at once: what a complete :class:`~tether.store.protocol.Store` passes.

    Every test receives ``store``: an opened, empty Store provided by the subclass.
    """
