"""The SQLite store: one file under the data directory, WAL, one writer thread.

The default backend (embedded use and a single server process). Its roles are split by what
they hold: sessions and keys (:mod:`.sessions`), turns and leases (:mod:`.turns`), the
decisions parked turns wait for (:mod:`.decisions`), memory and knowledge (:mod:`.recall`),
over one connection thread (:mod:`.connection`, :mod:`.worker`); statements are named
constants (:mod:`.queries`, :mod:`.recall_queries`), migrations are versioned
(:mod:`.migrations`).
"""

from __future__ import annotations

from tether.store.sqlite.decisions import Decisions
from tether.store.sqlite.recall import Recall
from tether.store.sqlite.sessions import Sessions
from tether.store.sqlite.turns import Turns

__all__ = ["SQLiteStore"]


class SQLiteStore(Sessions, Turns, Decisions, Recall):
    """``SQLiteStore(path)``: the store in the SQLite file at ``path`` (made on open)."""
