"""PostgreSQL's admissions of one owner's turns side by side: migration 23 (after
:mod:`.session_functions`).

Before it, every admission under a bound on the owner's turns took the owner's advisory lock
exclusively and held it to its commit, WAL flush included, so that its count saw what the
previous holder committed. All of one owner's admissions, in every process, went one commit
flush at a time: at 64 sessions of one owner, 5 to 15 ms inside ``tether_enqueue`` waiting for
the lock, where the admission itself takes 0.3-0.6 ms (``pg_stat_user_functions``).

A turn on an idle session adds one busy session. When the owner holds no more sessions than
the bound on busy ones, no admission can take the owner past it, whatever the others do at the
same time; such an admission need not count at all, only keep the number of the owner's
sessions from moving under it. So it takes the owner's lock *shared*: admissions of this kind
pass each other, while every step that counts (an admission behind a busy session, one of an
owner with more sessions than the bound, a session made under the owner's bound) takes the lock
exclusively as before and waits for all of them to commit. Why that is exact even with sessions
made meanwhile without the lock (no bound on sessions): of the admissions that took an owner
past the bound, the last to count would have counted every one of their sessions, each made
before its own admission found it, so it would have taken the lock exclusively and refused.

Append only, like every migration: a function is changed by a new migration that replaces it
(``CREATE OR REPLACE``) whole.
"""

from __future__ import annotations

OWNER_FUNCTIONS: list[tuple[int, str]] = [
    (
        23,
        """
        -- Whether the owner has room for one more turn, under the owner's lock held to
        -- commit: shared when the turn is on an idle session (p_active false) and the owner
        -- holds no more sessions than p_running (then nothing is counted and nothing is
        -- refused), exclusive otherwise (as migration 13's tether_enqueue: counted after the
        -- lock, in a new statement and so a new snapshot, over busy_sessions). A turn on an
        -- idle session with no bound on busy sessions changes no bounded count (it adds a busy
        -- session and its first turn, which is not waiting), so it takes no lock. busy and
        -- total are the counts when they were taken (NULL otherwise).
        CREATE FUNCTION tether_owner_room(p_tenant text, p_owner text, p_active boolean,
                                          p_running bigint, p_queued bigint,
                                          OUT refused boolean, OUT busy bigint,
                                          OUT total bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_key bigint := hashtextextended(p_tenant || chr(31) || p_owner, 7);
        BEGIN
            refused := false;
            IF NOT p_active THEN
                IF p_running IS NULL THEN
                    RETURN;
                END IF;
                BEGIN
                    PERFORM pg_advisory_xact_lock_shared(v_key);
                    IF (SELECT count(*) FROM (
                            SELECT 1 FROM sessions s
                             WHERE s.tenant = p_tenant AND s.owner = p_owner
                             LIMIT p_running + 1) n) <= p_running THEN
                        RETURN;  -- the block's subtransaction is kept, and the lock with it
                    END IF;
                    RAISE EXCEPTION USING ERRCODE = 'TH001';
                EXCEPTION WHEN SQLSTATE 'TH001' THEN
                    -- More sessions than the bound: rolling the block back gave the shared
                    -- lock back (an exclusive one taken over it could deadlock with another
                    -- admission doing the same), and the count below decides.
                    NULL;
                END;
            END IF;
            PERFORM pg_advisory_xact_lock(v_key);
            SELECT count(*), coalesce(sum(b.live), 0) INTO busy, total
              FROM busy_sessions b WHERE b.tenant = p_tenant AND b.owner = p_owner;
            refused := (p_active AND p_queued IS NOT NULL AND total - busy >= p_queued)
                       OR (NOT p_active AND p_running IS NOT NULL AND busy >= p_running);
        END
        $$;
        -- tether_enqueue as migration 17's overload, the owner's room asked of
        -- tether_owner_room.
        CREATE OR REPLACE FUNCTION tether_enqueue(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, p_lease_until double precision, OUT outcome text, OUT turn_seq bigint,
            OUT expires_at double precision, OUT active_ids text[], OUT active_statuses text[],
            OUT busy bigint, OUT total bigint, OUT r_token bigint, OUT r_next_item bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_active boolean;
            v_refused boolean;
            v_holder text;
            v_held_until double precision;
        BEGIN
            SELECT s.pk, s.expires_at, s.lease_owner, s.lease_expires_at
              INTO v_pk, expires_at, v_holder, v_held_until FROM sessions s
             WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
               FOR UPDATE;
            IF NOT FOUND THEN
                outcome := 'missing';
                RETURN;
            END IF;
            IF p_idem IS NOT NULL AND EXISTS (
                SELECT 1 FROM turns t WHERE t.session_pk = v_pk AND t.idempotency_key = p_idem
            ) THEN
                outcome := 'known';
                RETURN;
            END IF;
            SELECT coalesce(array_agg(t.id ORDER BY t.seq), '{}'),
                   coalesce(array_agg(t.status ORDER BY t.seq), '{}')
              INTO active_ids, active_statuses
              FROM turns t
             WHERE t.session_pk = v_pk AND t.status IN ('queued', 'running', 'awaiting_input');
            v_active := cardinality(active_ids) > 0;
            IF (expires_at IS NOT NULL AND expires_at <= p_now)
               OR (p_policy = 'reject' AND v_active)
               OR (SELECT count(*) FROM unnest(active_statuses) st WHERE st = 'queued')
                  >= p_max_queue THEN
                outcome := 'refused';
                RETURN;
            END IF;
            IF p_limits THEN
                SELECT o.refused, o.busy, o.total INTO v_refused, busy, total
                  FROM tether_owner_room(p_tenant, p_owner, v_active, p_running, p_queued) o;
                IF v_refused THEN
                    outcome := 'refused';
                    RETURN;
                END IF;
            END IF;
            UPDATE sessions SET next_turn_seq = next_turn_seq + 1 WHERE pk = v_pk
             RETURNING next_turn_seq - 1 INTO turn_seq;
            INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at, agent,
                               agent_fingerprint, idempotency_key, request_digest)
            VALUES (p_turn, v_pk, turn_seq, p_input, p_policy, 'queued', p_now, p_agent,
                    p_fingerprint, p_idem, p_digest);
            -- The data is rules.queued_event's, as json.dumps writes it.
            INSERT INTO events (turn_id, seq, type, data, created_at)
            VALUES (p_turn, p_event_seq, p_event_type, '{"seq": ' || turn_seq || '}', p_now);
            IF p_lease_until IS NOT NULL AND (v_holder IS NULL OR v_held_until <= p_now) THEN
                UPDATE sessions s SET lease_owner = p_by, lease_token = s.lease_token + 1,
                                      lease_expires_at = p_lease_until
                 WHERE s.pk = v_pk
                RETURNING s.lease_token, s.next_item_seq INTO r_token, r_next_item;
            ELSIF v_holder IS NOT NULL AND v_held_until > p_now
                  AND v_holder IS DISTINCT FROM p_by THEN
                -- As queries.NOTIFY_HOLDER: empty ("look at all you hold") for a key that
                -- cannot be told apart or would not fit a payload.
                PERFORM pg_notify('tether_queued',
                    CASE WHEN position(chr(31) IN p_tenant || p_owner || p_session) = 0
                          AND octet_length(p_tenant || p_owner || p_session) < 7900
                         THEN p_tenant || chr(31) || p_owner || chr(31) || p_session
                         ELSE '' END);
            END IF;
            outcome := 'queued';
        END
        $$;
        -- Migration 14's overload is migration 17's without a lease to take (p_lease_until
        -- NULL: the holder is told of the turn just the same): it now asks that one, so the
        -- admission is written once.
        CREATE OR REPLACE FUNCTION tether_enqueue(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint)
        LANGUAGE sql VOLATILE AS $$
            SELECT e.outcome, e.turn_seq, e.expires_at, e.active_ids, e.active_statuses,
                   e.busy, e.total
              FROM tether_enqueue(p_tenant, p_owner, p_session, p_turn, p_input, p_policy,
                                  p_now, p_agent, p_fingerprint, p_idem, p_digest,
                                  p_max_queue, p_limits, p_running, p_queued, p_event_seq,
                                  p_event_type, p_by, NULL::double precision) e
        $$;
        """,
    ),
]
