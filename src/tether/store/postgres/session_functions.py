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
    (
        17,
        """
        -- tether_enqueue as migration 14's, and, when p_lease_until is given and the session's
        -- lease is free or expired, the lease taken for p_by in the same transaction (under
        -- the session's row lock, which the function took first): a turn on an idle session
        -- is one round trip where the admission and the worker's acquisition made two. The
        -- lease's token and the seq the session's next item gets are r_token and r_next_item
        -- (NULL: not taken); active_statuses say whether a turn was left running, and
        -- active_ids with the new turn are its queue. A new overload: processes of the
        -- previous release go on calling the 18-argument one.
        CREATE FUNCTION tether_enqueue(
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
                -- After the lock, a new statement, so a new snapshot: the count sees what
                -- the lock's previous holder committed.
                PERFORM pg_advisory_xact_lock(
                    hashtextextended(p_tenant || chr(31) || p_owner, 7));
                SELECT count(*), coalesce(sum(b.live), 0) INTO busy, total
                  FROM busy_sessions b WHERE b.tenant = p_tenant AND b.owner = p_owner;
                IF (v_active AND p_queued IS NOT NULL AND total - busy >= p_queued)
                   OR (NOT v_active AND p_running IS NOT NULL AND busy >= p_running) THEN
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
        """,
    ),
    (
        18,
        """
        -- A turn admitted under a lease its caller holds, and started at once when no other
        -- turn of the session is active: what tether_enqueue (migration 14's overload) and
        -- then tether_write (its start) do, in one transaction and one round trip, fenced by
        -- p_token before anything is written. outcome: 'missing', 'stale' (current_token is
        -- the session's), what tether_enqueue answers when it does not queue the turn
        -- ('refused', 'known', with its columns), 'queued' (it waits behind another turn), or
        -- 'started' (first_seq: the seq of the first item written).
        CREATE FUNCTION tether_enqueue_started(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, p_token bigint,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint, OUT current_token bigint, OUT first_seq bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_written text;
        BEGIN
            SELECT s.lease_token INTO current_token FROM sessions s
             WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
               FOR UPDATE;
            IF NOT FOUND THEN
                outcome := 'missing';
                RETURN;
            END IF;
            IF current_token <> p_token THEN
                outcome := 'stale';
                RETURN;
            END IF;
            SELECT e.outcome, e.turn_seq, e.expires_at, e.active_ids, e.active_statuses,
                   e.busy, e.total
              INTO outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total
              FROM tether_enqueue(p_tenant, p_owner, p_session, p_turn, p_input, p_policy,
                                  p_now, p_agent, p_fingerprint, p_idem, p_digest,
                                  p_max_queue, p_limits, p_running, p_queued, p_event_seq,
                                  p_event_type, p_by) e;
            IF outcome <> 'queued' OR cardinality(active_ids) > 0 THEN
                RETURN;  -- refused, a retry's, or behind another turn: as tether_enqueue left it
            END IF;
            SELECT w.outcome, w.first_seq INTO v_written, first_seq
              FROM tether_write(p_tenant, p_owner, p_session, p_token, p_turn, true, p_now,
                                p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                                p_arguments, p_metas, p_event_seqs, p_event_lasts,
                                p_event_types, p_event_datas) w;
            IF v_written = 'written' THEN
                outcome := 'started';
            END IF;
        END
        $$;
        """,
    ),
    (
        19,
        """
        -- tether_enqueue as migration 17's overload (the session's lease taken for p_by when it
        -- is free or expired), and, when it took the lease and no other turn of the session is
        -- active, the turn started under the new lease in the same transaction, as
        -- tether_enqueue_started starts it: a turn on an idle session is admitted, leased and
        -- started in one round trip where it took two. outcome: tether_enqueue's, or
        -- 'started' (first_seq: the seq of the first item written); r_token and r_next_item
        -- as tether_enqueue's (the history before the turn's items). With p_expect_agent,
        -- 'agent' (found_agent: the session's) when the session names another agent: the
        -- caller chose the turn's agent by what it knew, and nothing is written.
        CREATE FUNCTION tether_enqueue_taken(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, p_lease_until double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[], p_expect_agent text,
            OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint, OUT r_token bigint, OUT r_next_item bigint, OUT first_seq bigint,
            OUT found_agent text)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_written text;
        BEGIN
            IF p_expect_agent IS NOT NULL THEN
                -- Under the row lock tether_enqueue then takes again: the agent cannot change
                -- between this look and the admission.
                SELECT s.agent INTO found_agent FROM sessions s
                 WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
                   FOR UPDATE;
                IF FOUND AND found_agent IS DISTINCT FROM p_expect_agent THEN
                    outcome := 'agent';
                    RETURN;
                END IF;
            END IF;
            SELECT e.outcome, e.turn_seq, e.expires_at, e.active_ids, e.active_statuses,
                   e.busy, e.total, e.r_token, e.r_next_item
              INTO outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total,
                   r_token, r_next_item
              FROM tether_enqueue(p_tenant, p_owner, p_session, p_turn, p_input, p_policy,
                                  p_now, p_agent, p_fingerprint, p_idem, p_digest,
                                  p_max_queue, p_limits, p_running, p_queued, p_event_seq,
                                  p_event_type, p_by, p_lease_until) e;
            IF outcome <> 'queued' OR r_token IS NULL OR cardinality(active_ids) > 0 THEN
                RETURN;  -- as tether_enqueue left it: not leased here, or behind another turn
            END IF;
            SELECT w.outcome, w.first_seq INTO v_written, first_seq
              FROM tether_write(p_tenant, p_owner, p_session, r_token, p_turn, true, p_now,
                                p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                                p_arguments, p_metas, p_event_seqs, p_event_lasts,
                                p_event_types, p_event_datas) w;
            IF v_written = 'written' THEN
                outcome := 'started';
            END IF;
        END
        $$;
        """,
    ),
]

IDLE_TTL: list[tuple[int, str]] = [
    (
        21,
        """
        -- A session whose TTL counts from its latest activity (a one-off the OpenAI face made,
        -- which its client may go on with for months): idle_ttl, and its expiry moved with
        -- every write that moves updated_at, by whichever process (or release) writes.
        ALTER TABLE sessions ADD COLUMN idle_ttl double precision;
        CREATE FUNCTION tether_idle_expiry() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            NEW.expires_at := NEW.updated_at + NEW.idle_ttl;
            RETURN NEW;
        END
        $$;
        CREATE TRIGGER sessions_idle_expiry BEFORE UPDATE OF updated_at ON sessions
            FOR EACH ROW WHEN (NEW.idle_ttl IS NOT NULL) EXECUTE FUNCTION tether_idle_expiry();
        -- tether_create_session as migration 15's, the session made with p_idle_ttl. The
        -- 9-argument one, which processes of the previous release call, makes it without.
        CREATE FUNCTION tether_create_session(
            p_tenant text, p_owner text, p_session text, p_agent text, p_metadata text,
            p_now double precision, p_expires double precision, p_token bigint,
            p_max bigint, p_idle_ttl double precision, OUT outcome text,
            OUT sessions_held bigint, OUT r_tenant text, OUT r_owner text, OUT r_session text,
            OUT r_agent text, OUT r_metadata text, OUT r_state text,
            OUT r_created double precision, OUT r_updated double precision,
            OUT r_expires double precision, OUT r_revision bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || chr(31) || p_owner, 7));
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
                                       updated_at, expires_at, lease_token, idle_ttl)
            VALUES (p_tenant, p_owner, p_session, p_agent, p_metadata, p_now, p_now,
                    p_expires, p_token, p_idle_ttl)
            ON CONFLICT (tenant, owner, session_id) DO NOTHING
            RETURNING s.tenant, s.owner, s.session_id, s.agent, s.metadata, s.state,
                      s.created_at, s.updated_at, s.expires_at, s.revision
                 INTO r_tenant, r_owner, r_session, r_agent, r_metadata, r_state, r_created,
                      r_updated, r_expires, r_revision;
            outcome := CASE WHEN FOUND THEN 'created' ELSE 'raced' END;
        END
        $$;
        CREATE OR REPLACE FUNCTION tether_create_session(
            p_tenant text, p_owner text, p_session text, p_agent text, p_metadata text,
            p_now double precision, p_expires double precision, p_token bigint,
            p_max bigint, OUT outcome text, OUT sessions_held bigint, OUT r_tenant text,
            OUT r_owner text, OUT r_session text, OUT r_agent text, OUT r_metadata text,
            OUT r_state text, OUT r_created double precision, OUT r_updated double precision,
            OUT r_expires double precision, OUT r_revision bigint)
        LANGUAGE sql VOLATILE AS $$
            SELECT * FROM tether_create_session(p_tenant, p_owner, p_session, p_agent,
                p_metadata, p_now, p_expires, p_token, p_max, NULL::double precision)
        $$;
        """,
    ),
    (
        22,
        """
        -- An update that sets the expiry itself gives the session a TTL of its own, whoever
        -- makes it: migration 21's trigger moved it back to the latest activity when the
        -- update came from a process of the previous release (which does not clear idle_ttl).
        CREATE OR REPLACE FUNCTION tether_idle_expiry() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.expires_at IS DISTINCT FROM OLD.expires_at THEN
                NEW.idle_ttl := NULL;
            ELSE
                NEW.expires_at := NEW.updated_at + NEW.idle_ttl;
            END IF;
            RETURN NEW;
        END
        $$;
        """,
    ),
]

TAKEN_AT_ONCE: list[tuple[int, str]] = [
    (
        24,
        """
        -- tether_enqueue_taken as migration 19's, its common case in one body: a turn on an
        -- idle session (the lease free or expired, no turn of the session active, no
        -- idempotency key, items to write) is admitted, leased and started with one update of
        -- the session's row and one insert a table, where tether_enqueue then tether_write
        -- took the row twice, updated it three times, and wrote the turn queued then running
        -- (19 statements and two trigger calls; 9 and one now). What is committed is what the
        -- two committed; only the row versions in between are gone. The checks are theirs,
        -- in their order; a case they would answer otherwise (a refusal but the owner's
        -- bound, a turn ahead, events that would not follow the queued one) goes migration
        -- 19's way, which looks again under the row lock this transaction then holds. (A call
        -- the store never makes, with invalid arrays, may fail on another constraint first:
        -- the events are written before the items.)
        CREATE OR REPLACE FUNCTION tether_enqueue_taken(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, p_lease_until double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[], p_expect_agent text,
            OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint, OUT r_token bigint, OUT r_next_item bigint, OUT first_seq bigint,
            OUT found_agent text)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_written text;
            v_pk bigint;
            v_holder text;
            v_held_until double precision;
            v_count integer := cardinality(p_kinds);
        BEGIN
            IF p_expect_agent IS NOT NULL THEN
                -- Under the row lock the admission then takes again: the agent cannot change
                -- between this look and the admission.
                SELECT s.agent INTO found_agent FROM sessions s
                 WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
                   FOR UPDATE;
                IF FOUND AND found_agent IS DISTINCT FROM p_expect_agent THEN
                    outcome := 'agent';
                    RETURN;
                END IF;
            END IF;
            IF p_idem IS NULL AND p_lease_until IS NOT NULL AND v_count > 0
               AND p_max_queue > 0
               AND (cardinality(p_event_seqs) = 0
                    OR (SELECT min(x) FROM unnest(p_event_seqs) x) > p_event_seq) THEN
                SELECT s.pk, s.expires_at, s.lease_owner, s.lease_expires_at
                  INTO v_pk, expires_at, v_holder, v_held_until FROM sessions s
                 WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session
                   FOR UPDATE;
                IF NOT FOUND THEN
                    -- tether_enqueue's answer, from this look: a second, with a newer
                    -- snapshot, could find a session made meanwhile, which 19's did not.
                    outcome := 'missing';
                    RETURN;
                END IF;
                IF (v_holder IS NULL OR v_held_until <= p_now)
                   AND (expires_at IS NULL OR expires_at > p_now)
                   AND NOT EXISTS (
                       SELECT 1 FROM turns t WHERE t.session_pk = v_pk
                          AND t.status IN ('queued', 'running', 'awaiting_input')) THEN
                    active_ids := '{}';
                    active_statuses := '{}';
                    IF p_limits THEN
                        -- After the lock, a new statement, so a new snapshot: the count sees
                        -- what the lock's previous holder committed.
                        PERFORM pg_advisory_xact_lock(
                            hashtextextended(p_tenant || chr(31) || p_owner, 7));
                        SELECT count(*), coalesce(sum(b.live), 0) INTO busy, total
                          FROM busy_sessions b WHERE b.tenant = p_tenant AND b.owner = p_owner;
                        IF p_running IS NOT NULL AND busy >= p_running THEN
                            outcome := 'refused';
                            RETURN;
                        END IF;
                    END IF;
                    -- The admission's seq, the lease, the items' seqs: tether_enqueue's two
                    -- updates and tether_write's, whose RETURNING values these are.
                    UPDATE sessions SET next_turn_seq = next_turn_seq + 1, lease_owner = p_by,
                           lease_token = lease_token + 1, lease_expires_at = p_lease_until,
                           next_item_seq = next_item_seq + v_count, updated_at = p_now
                     WHERE pk = v_pk
                    RETURNING next_turn_seq - 1, lease_token, next_item_seq - v_count
                         INTO turn_seq, r_token, r_next_item;
                    first_seq := r_next_item;
                    INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at,
                                       started_at, agent, agent_fingerprint, idempotency_key,
                                       request_digest)
                    VALUES (p_turn, v_pk, turn_seq, p_input, p_policy, 'running', p_now, p_now,
                            p_agent, p_fingerprint, NULL, p_digest);
                    -- The queued event's data is rules.queued_event's, as json.dumps writes it.
                    INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)
                    SELECT p_turn, p_event_seq, NULL, p_event_type,
                           '{"seq": ' || turn_seq || '}', p_now
                    UNION ALL
                    SELECT p_turn, u.seq, u.last_seq, u.type, u.data, p_now
                      FROM unnest(p_event_seqs, p_event_lasts, p_event_types, p_event_datas)
                           AS u(seq, last_seq, type, data);
                    INSERT INTO items (session_pk, seq, turn_id, kind, content, complete,
                                       call_id, tool_name, arguments, meta, created_at)
                    SELECT v_pk, first_seq + u.n - 1, p_turn, u.kind, u.content, u.complete,
                           u.call_id, u.tool_name, u.arguments, u.meta, p_now
                      FROM unnest(p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                                  p_arguments, p_metas)
                           WITH ORDINALITY AS u(kind, content, complete, call_id, tool_name,
                                                arguments, meta, n);
                    outcome := 'started';
                    RETURN;
                END IF;
            END IF;
            SELECT e.outcome, e.turn_seq, e.expires_at, e.active_ids, e.active_statuses,
                   e.busy, e.total, e.r_token, e.r_next_item
              INTO outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total,
                   r_token, r_next_item
              FROM tether_enqueue(p_tenant, p_owner, p_session, p_turn, p_input, p_policy,
                                  p_now, p_agent, p_fingerprint, p_idem, p_digest,
                                  p_max_queue, p_limits, p_running, p_queued, p_event_seq,
                                  p_event_type, p_by, p_lease_until) e;
            IF outcome <> 'queued' OR r_token IS NULL OR cardinality(active_ids) > 0 THEN
                RETURN;  -- as tether_enqueue left it: not leased here, or behind another turn
            END IF;
            SELECT w.outcome, w.first_seq INTO v_written, first_seq
              FROM tether_write(p_tenant, p_owner, p_session, r_token, p_turn, true, p_now,
                                p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                                p_arguments, p_metas, p_event_seqs, p_event_lasts,
                                p_event_types, p_event_datas) w;
            IF v_written = 'written' THEN
                outcome := 'started';
            END IF;
        END
        $$;
        """,
    ),
]
"""Migration 24: the admission that takes a free lease and starts the turn, in one body."""
