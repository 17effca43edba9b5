"""The PostgreSQL store: several server processes sharing one database.

Its roles are split by what they hold: sessions and keys (:mod:`.sessions`), turns and leases
(:mod:`.turns`), the decisions parked turns wait for (:mod:`.decisions`), memory and knowledge
(:mod:`.recall`), the cancel feed (:mod:`.listen`), over one asyncpg pool (:mod:`.connection`);
statements are named constants (:mod:`.queries`, :mod:`.recall_queries`), the fenced
transaction steps are :mod:`.steps`, migrations are versioned (:mod:`.migrations`).
"""

from __future__ import annotations

from tether.store.postgres.decisions import Decisions
from tether.store.postgres.listen import LISTENER_NAME, CancelListener
from tether.store.postgres.recall import Recall
from tether.store.postgres.sessions import Sessions
from tether.store.postgres.turns import Turns

__all__ = ["LISTENER_NAME", "PostgresStore"]


class PostgresStore(Sessions, Turns, Decisions, Recall, CancelListener):
    """``PostgresStore(url)``: the store in the PostgreSQL database at ``url``.

    Query parameters asyncpg does not know (``search_path``…) become server settings.
    """
