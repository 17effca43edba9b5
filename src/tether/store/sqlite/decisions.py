"""Decisions parked turns wait for, for the SQLite store (the DecisionStore role).

No lease: a parked turn's decision is made from any process. Each call is one ``BEGIN
IMMEDIATE`` transaction, so the decision read pending is still pending when it is ended, and of
two deciders the second reads the first one's decision (DecisionMade).
"""

from __future__ import annotations

import json
import sqlite3
import time

from tether.errors import DecisionNotFound, SessionNotFound
from tether.records import Decision, DecisionStatus, SessionKey, Verdict
from tether.store import rules
from tether.store.rows import decision_row
from tether.store.sqlite import queries as q
from tether.store.sqlite import steps
from tether.store.sqlite.connection import Connection


class Decisions(Connection):
    async def list_decisions(
        self,
        key: SessionKey,
        *,
        turn_id: str | None = None,
        status: DecisionStatus | None = None,
        limit: int = 100,
    ) -> list[Decision]:
        def do(c: sqlite3.Connection) -> list[Decision]:
            args = (steps.session_pk(c, key), turn_id, turn_id, status, status, limit)
            return [decision_row(key, r) for r in c.execute(q.LIST_DECISIONS, args)]

        return await self._run(do)

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
        def do(c: sqlite3.Connection) -> Decision:
            try:
                pk = steps.session_pk(c, key)
            except SessionNotFound:
                raise DecisionNotFound("decision not found") from None
            row = c.execute(q.GET_DECISION, (pk, turn_id, call_id)).fetchone()
            if row is None:
                raise DecisionNotFound("decision not found")
            now = time.time()
            # Raises (nothing written) when it is already decided or the verdict does not fit.
            done = rules.settle(decision_row(key, row), verdict, answer, by, now)
            steps.close_decision(c, done, now, requeue=True)
            if done.status == "always":
                (state,) = c.execute(q.SESSION_STATE, (pk,)).fetchone()
                approved = rules.with_always(json.loads(state), str(done.payload["tool"]))
                c.execute(q.SET_SESSION_STATE, (json.dumps(approved), now, pk))
            return done

        return await self._write(do)

    async def expire_decisions(self, now: float, limit: int = 100) -> list[SessionKey]:
        def do(c: sqlite3.Connection) -> list[SessionKey]:
            keys = []
            for row in c.execute(q.DUE_DECISIONS, (now, limit)).fetchall():
                key = SessionKey(row[0], row[1], row[2])
                done = rules.expired(decision_row(key, row[3:]), now)
                steps.close_decision(c, done, now, requeue=True)
                keys.append(key)
            return keys

        return await self._write(do)

    async def next_decision_deadline(self) -> float | None:
        def do(c: sqlite3.Connection) -> float | None:
            (deadline,) = c.execute(q.NEXT_DECISION_DEADLINE).fetchone()
            return float(deadline) if deadline is not None else None

        return await self._run(do)
