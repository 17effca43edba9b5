"""Decisions parked turns wait for, for the PostgreSQL store (the DecisionStore role).

No lease: a parked turn's decision is made from any process. Every write here takes the
session's row lock first, as the fenced writes and admissions do, so the decision read pending
stays pending until it is ended: of two deciders the second waits, then reads the first one's
decision (DecisionMade). The deadline sweep skips sessions another transaction holds, so every
node may sweep at once without waiting on one another or ending a decision twice.
"""

from __future__ import annotations

import json
import time

from tether.errors import DecisionNotFound
from tether.records import Decision, DecisionStatus, SessionKey, Verdict
from tether.store import rules
from tether.store.postgres import queries as q
from tether.store.postgres import steps
from tether.store.postgres.connection import Connection
from tether.store.rows import decision_row, key_args


class Decisions(Connection):
    async def list_decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
        limit: int = 100,
    ) -> list[Decision]:
        rows = await self._rows_of(key, q.LIST_DECISIONS, turn_id, status, max(limit, 0))
        return [decision_row(key, r) for r in rows]

    async def decide(
        self,
        key: SessionKey,
        turn_id: str,
        call_id: str,
        verdict: Verdict,
        *,
        answer: str | None = None,
        by: str,
    ) -> Decision:
        async with self._tx() as conn:
            session = await conn.fetchrow(q.LOCK_SESSION_STATE, *key_args(key))
            row = None
            if session is not None:
                row = await conn.fetchrow(q.GET_DECISION, session[0], turn_id, call_id)
            if session is None or row is None:
                raise DecisionNotFound("decision not found")
            now = time.time()
            # Raises (nothing written) when it is already decided or the verdict does not fit.
            done = rules.settle(decision_row(key, row), verdict, answer, by, now)
            await steps.close_decision(conn, done, now, requeue=True)
            if done.status == "always":
                state = rules.with_always(json.loads(session[1]), str(done.payload["tool"]))
                await conn.execute(q.SET_SESSION_STATE, session[0], json.dumps(state), now)
            return done

    async def expire_decisions(self, now: float, limit: int = 100) -> list[SessionKey]:
        keys = []
        async with self._tx() as conn:
            for row in await conn.fetch(q.DUE_DECISIONS, now, max(limit, 0)):
                key = SessionKey(row[1], row[2], row[3])
                # The row was read before its session's lock was taken: the decision may have
                # been made meanwhile, and then it is not ended again.
                done = rules.expired(decision_row(key, tuple(row)[4:]), now)
                if await steps.close_decision(conn, done, now, requeue=True):
                    keys.append(key)
        return keys

    async def next_decision_deadline(self) -> float | None:
        deadline = await self._fetchval(q.NEXT_DECISION_DEADLINE)
        return float(deadline) if deadline is not None else None
