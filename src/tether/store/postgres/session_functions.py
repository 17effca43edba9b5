"""PostgreSQL's stored functions for sessions and their leases: migrations 15 on (after
:mod:`.functions`).

Append only, like every migration: a function is changed by a new migration that replaces it
(``CREATE OR REPLACE``) whole.
"""

from __future__ import annotations

SESSION_FUNCTIONS: list[tuple[int, str]] = [
    (
        15,
        """
        -- A session made under its owner's bound in one round trip, for migration 9's reasons:
        -- the owner's lock is held for one statement, never while this process's event loop
        -- is away (it was held over three round trips, and every admission of the owner's
        -- turns waited behind it), and the insert is made under the lock, so two creations
        -- cannot both see room for one (before, it came after the lock's transaction ended).
        -- outcome: 'created', 'exists' (the r_ columns are the session's), 'full' (the owner
        -- holds sessions_held), or 'raced' (a creation without a bound, which takes no lock,
        -- made it meanwhile).
        CREATE FUNCTION tether_create_session(
            p_tenant text, p_owner text, p_session text, p_agent text, p_metadata text,
            p_now double precision, p_expires double precision, p_token bigint,
            p_max bigint, OUT outcome text, OUT sessions_held bigint, OUT r_tenant text,
            OUT r_owner text, OUT r_session text, OUT r_agent text, OUT r_metadata text,
            OUT r_state text, OUT r_created double precision, OUT r_updated double precision,
            OUT r_expires double precision, OUT r_revision bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || chr(31) || p_owner, 7));
            -- Statements after the lock take new snapshots: they see what its previous
            -- holder committed.
            SELECT s.tenant, s.owner, s.session_id, s.agent, s.metadata, s.state,
                   s.created_at, s.updated_at, s.expires_at, s.revision
              INTO r_tenant, r_owner, r_session, r_agent, r_metadata, r_state, r_created,
                   r_updated, r_expires, r_revision
              FROM sessions s
             WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session;
            IF FOUND THEN
                outcome := 'exists';
                RETURN;
            END IF;
            SELECT count(*) INTO sessions_held FROM sessions s
             WHERE s.tenant = p_tenant AND s.owner = p_owner;
            IF sessions_held >= p_max THEN
                outcome := 'full';
                RETURN;
            END IF;
            INSERT INTO sessions AS s (tenant, owner, session_id, agent, metadata, created_at,
                                       updated_at, expires_at, lease_token)
            VALUES (p_tenant, p_owner, p_session, p_agent, p_metadata, p_now, p_now,
                    p_expires, p_token)
            ON CONFLICT (tenant, owner, session_id) DO NOTHING
            RETURNING s.tenant, s.owner, s.session_id, s.agent, s.metadata, s.state,
                      s.created_at, s.updated_at, s.expires_at, s.revision
                 INTO r_tenant, r_owner, r_session, r_agent, r_metadata, r_state, r_created,
                      r_updated, r_expires, r_revision;
            outcome := CASE WHEN FOUND THEN 'created' ELSE 'raced' END;
        END
        $$;
        """,
    ),
    (
        16,
        """
        -- A session's lease with what its holder needs to know of the session, in one round
        -- trip: the token, the seq its next item gets, whether a turn was left running, and
        -- the ids of its active turns. The looks come after the UPDATE, as statements of
        -- their own, so with snapshots of their own: they see every start and admission
        -- committed before the row lock was this transaction's (one in flight held the row,
        -- and the UPDATE waited for it), and none can come after it unseen (each takes the row
        -- first, then finds the new token, or the new holder to announce the turn to). A
        -- RETURNING subquery would look with the statement's first snapshot, from before the
        -- wait. No row: the lease is held (or the session missing).
        CREATE FUNCTION tether_acquire(
            p_tenant text, p_owner text, p_session text, p_by text,
            p_expires double precision, p_now double precision,
            OUT token bigint, OUT next_item bigint, OUT running boolean, OUT queue text[])
        RETURNS SETOF record LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
        BEGIN
            UPDATE sessions s SET lease_owner = p_by, lease_token = s.lease_token + 1,
                                  lease_expires_at = p_expires
             WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
               AND (s.lease_owner IS NULL OR s.lease_expires_at <= p_now)
            RETURNING s.pk, s.lease_token, s.next_item_seq INTO v_pk, token, next_item;
            IF NOT FOUND THEN
                RETURN;
            END IF;
            SELECT coalesce(array_agg(t.id ORDER BY t.seq), '{}'),
                   coalesce(bool_or(t.status = 'running'), false)
              INTO queue, running
              FROM turns t
             WHERE t.session_pk = v_pk AND t.status IN ('queued', 'running', 'awaiting_input');
            RETURN NEXT;
        END
        $$;
        """,
    ),
]
