"""PostgreSQL's stored functions: the hot path's statements that each do a whole step (an
admission, a running turn's write, its ending) in one round trip, committed as they return.

They are migrations 9 on of :data:`tether.store.postgres.migrations.MIGRATIONS`, kept here
apart from the tables and indexes; append only, like every migration: a function is changed by
a new migration that replaces it (``CREATE OR REPLACE``) whole.
"""

from __future__ import annotations

FUNCTIONS: list[tuple[int, str]] = [
    (
        9,
        """
        -- An admission's owner lock and the owner's counts in one round trip. The lock is held
        -- to commit, so every round trip after it lengthens the queue of the owner's other
        -- admissions (a busy client process waits long between round trips). Each statement
        -- of a VOLATILE plpgsql function at READ COMMITTED takes a new snapshot, so the count
        -- sees what the lock's previous holder committed (in one plain statement it would not).
        CREATE FUNCTION tether_owner_active(p_tenant text, p_owner text,
                                            OUT busy bigint, OUT active bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || chr(31) || p_owner, 7));
            SELECT count(DISTINCT t.session_pk), count(*) INTO busy, active
              FROM turns t JOIN sessions s ON s.pk = t.session_pk
             WHERE t.status IN ('queued', 'running') AND s.tenant = p_tenant
               AND s.owner = p_owner;
        END
        $$;
        -- A whole admission in one statement: run outside a transaction, it commits as it
        -- returns, so no lock it takes (the session's row, the owner's) waits on the client.
        -- It decides as rules.admit and rules.admit_for_principal do; a refusal writes
        -- nothing and returns the facts, from which the caller raises the rule's own error.
        -- A known idempotency key is left to the caller's transaction ('known'). A turn id
        -- that exists already fails the insert (unique_violation), which undoes the seq too.
        CREATE FUNCTION tether_enqueue(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_active boolean;
        BEGIN
            SELECT s.pk, s.expires_at INTO v_pk, expires_at FROM sessions s
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
                SELECT count(DISTINCT t.session_pk), count(*) INTO busy, total
                  FROM turns t JOIN sessions s ON s.pk = t.session_pk
                 WHERE t.status IN ('queued', 'running') AND s.tenant = p_tenant
                   AND s.owner = p_owner;
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
            outcome := 'queued';
        END
        $$;
        """,
    ),
    (
        10,
        """
        -- A running turn's fenced write (its start, a step, a flush of events) in one
        -- statement, committed as it returns: the session's row lock is never held across a
        -- round trip to the client. It checks what steps.fenced_pk and the status checks do
        -- (the lease's token, the turn's status, the events' seqs past those written) and
        -- answers the first that fails; the caller raises the rule's own error.
        CREATE FUNCTION tether_write(
            p_tenant text, p_owner text, p_session text, p_token bigint, p_turn text,
            p_start boolean, p_now double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            OUT outcome text, OUT current_token bigint, OUT first_seq bigint,
            OUT last_event bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_count integer := cardinality(p_kinds);
        BEGIN
            SELECT s.pk, s.lease_token INTO v_pk, current_token FROM sessions s
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
            -- Every refusal comes before the first write: a RETURN commits what was done.
            PERFORM 1 FROM turns
             WHERE id = p_turn AND session_pk = v_pk
               AND CASE WHEN p_start THEN status = 'queued' AND started_at IS NULL
                        ELSE status = 'running' END;
            IF NOT FOUND THEN
                outcome := 'status';
                RETURN;
            END IF;
            IF cardinality(p_event_seqs) > 0 THEN
                SELECT COALESCE(MAX(COALESCE(e.last_seq, e.seq)), 0) INTO last_event
                  FROM events e WHERE e.turn_id = p_turn;
                IF (SELECT min(x) FROM unnest(p_event_seqs) x) <= last_event THEN
                    outcome := 'events';
                    RETURN;
                END IF;
            END IF;
            IF p_start THEN
                UPDATE turns SET status = 'running', started_at = p_now WHERE id = p_turn;
            END IF;
            IF v_count > 0 THEN
                UPDATE sessions SET next_item_seq = next_item_seq + v_count, updated_at = p_now
                 WHERE pk = v_pk RETURNING next_item_seq - v_count INTO first_seq;
                INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,
                                   tool_name, arguments, meta, created_at)
                SELECT v_pk, first_seq + u.n - 1, p_turn, u.kind, u.content, u.complete,
                       u.call_id, u.tool_name, u.arguments, u.meta, p_now
                  FROM unnest(p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                              p_arguments, p_metas)
                       WITH ORDINALITY AS u(kind, content, complete, call_id, tool_name,
                                            arguments, meta, n);
            END IF;
            INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)
            SELECT p_turn, u.seq, u.last_seq, u.type, u.data, p_now
              FROM unnest(p_event_seqs, p_event_lasts, p_event_types, p_event_datas)
                   AS u(seq, last_seq, type, data);
            outcome := 'written';
        END
        $$;
        """,
    ),
    (
        11,
        """
        -- A running turn's ending (end_turn without memory writes) in one statement,
        -- committed as it returns: tether_write's checks and writes, then what the ending does
        -- to the turn's items (rules.items_effect: 'delete' or 'exclude', after the items
        -- written here) and the ending itself. The OUT turn columns are the row as it was,
        -- which the caller completes with the ending (rules.ended).
        CREATE FUNCTION tether_end(
            p_tenant text, p_owner text, p_session text, p_token bigint, p_turn text,
            p_now double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            p_effect text, p_status text, p_reason text, p_error text, p_output text,
            p_complete boolean, p_usage text, p_ran_by text,
            OUT outcome text, OUT current_token bigint, OUT first_seq bigint,
            OUT last_event bigint, OUT turn_seq bigint, OUT turn_input text,
            OUT turn_policy text, OUT turn_created double precision,
            OUT turn_started double precision, OUT turn_agent text, OUT turn_fingerprint text)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_count integer := cardinality(p_kinds);
        BEGIN
            SELECT s.pk, s.lease_token INTO v_pk, current_token FROM sessions s
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
            -- Every refusal comes before the first write: a RETURN commits what was done.
            SELECT t.seq, t.input, t.policy, t.created_at, t.started_at, t.agent,
                   t.agent_fingerprint
              INTO turn_seq, turn_input, turn_policy, turn_created, turn_started, turn_agent,
                   turn_fingerprint
              FROM turns t WHERE t.id = p_turn AND t.session_pk = v_pk AND t.status = 'running';
            IF NOT FOUND THEN
                outcome := 'status';
                RETURN;
            END IF;
            IF cardinality(p_event_seqs) > 0 THEN
                SELECT COALESCE(MAX(COALESCE(e.last_seq, e.seq)), 0) INTO last_event
                  FROM events e WHERE e.turn_id = p_turn;
                IF (SELECT min(x) FROM unnest(p_event_seqs) x) <= last_event THEN
                    outcome := 'events';
                    RETURN;
                END IF;
            END IF;
            IF v_count > 0 THEN
                UPDATE sessions SET next_item_seq = next_item_seq + v_count, updated_at = p_now
                 WHERE pk = v_pk RETURNING next_item_seq - v_count INTO first_seq;
                INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,
                                   tool_name, arguments, meta, created_at)
                SELECT v_pk, first_seq + u.n - 1, p_turn, u.kind, u.content, u.complete,
                       u.call_id, u.tool_name, u.arguments, u.meta, p_now
                  FROM unnest(p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                              p_arguments, p_metas)
                       WITH ORDINALITY AS u(kind, content, complete, call_id, tool_name,
                                            arguments, meta, n);
            END IF;
            INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)
            SELECT p_turn, u.seq, u.last_seq, u.type, u.data, p_now
              FROM unnest(p_event_seqs, p_event_lasts, p_event_types, p_event_datas)
                   AS u(seq, last_seq, type, data);
            IF p_effect = 'delete' THEN
                DELETE FROM items WHERE session_pk = v_pk AND turn_id = p_turn;
            ELSIF p_effect = 'exclude' THEN
                UPDATE items SET excluded = true WHERE session_pk = v_pk AND turn_id = p_turn;
            END IF;
            UPDATE turns SET status = p_status, reason = p_reason, error = p_error,
                   output = p_output, complete = p_complete, usage = p_usage, ended_at = p_now,
                   ran_by = p_ran_by, held_memory = NULL
             WHERE id = p_turn;
            outcome := 'ended';
        END
        $$;
        """,
    ),
    (
        12,
        """
        -- tether_write as migration 10's, and a start of a turn that an earlier active turn
        -- of its session precedes is refused ('not_next'): the store keeps the session's order,
        -- so a worker may start the turn it was handed without reading the queue first.
        CREATE OR REPLACE FUNCTION tether_write(
            p_tenant text, p_owner text, p_session text, p_token bigint, p_turn text,
            p_start boolean, p_now double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            OUT outcome text, OUT current_token bigint, OUT first_seq bigint,
            OUT last_event bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_count integer := cardinality(p_kinds);
        BEGIN
            SELECT s.pk, s.lease_token INTO v_pk, current_token FROM sessions s
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
            -- Every refusal comes before the first write: a RETURN commits what was done.
            PERFORM 1 FROM turns
             WHERE id = p_turn AND session_pk = v_pk
               AND CASE WHEN p_start THEN status = 'queued' AND started_at IS NULL
                        ELSE status = 'running' END;
            IF NOT FOUND THEN
                outcome := 'status';
                RETURN;
            END IF;
            -- A session's turns start in the order they were accepted: not while an earlier
            -- one is still active. (Earlier active turns only ever end, so once none is left
            -- none can come back.)
            IF p_start THEN
                PERFORM 1 FROM turns e
                 WHERE e.session_pk = v_pk
                   AND e.status IN ('queued', 'running', 'awaiting_input')
                   AND e.seq < (SELECT t.seq FROM turns t WHERE t.id = p_turn);
                IF FOUND THEN
                    outcome := 'not_next';
                    RETURN;
                END IF;
            END IF;
            IF cardinality(p_event_seqs) > 0 THEN
                SELECT COALESCE(MAX(COALESCE(e.last_seq, e.seq)), 0) INTO last_event
                  FROM events e WHERE e.turn_id = p_turn;
                IF (SELECT min(x) FROM unnest(p_event_seqs) x) <= last_event THEN
                    outcome := 'events';
                    RETURN;
                END IF;
            END IF;
            IF p_start THEN
                UPDATE turns SET status = 'running', started_at = p_now WHERE id = p_turn;
            END IF;
            IF v_count > 0 THEN
                UPDATE sessions SET next_item_seq = next_item_seq + v_count, updated_at = p_now
                 WHERE pk = v_pk RETURNING next_item_seq - v_count INTO first_seq;
                INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,
                                   tool_name, arguments, meta, created_at)
                SELECT v_pk, first_seq + u.n - 1, p_turn, u.kind, u.content, u.complete,
                       u.call_id, u.tool_name, u.arguments, u.meta, p_now
                  FROM unnest(p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                              p_arguments, p_metas)
                       WITH ORDINALITY AS u(kind, content, complete, call_id, tool_name,
                                            arguments, meta, n);
            END IF;
            INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)
            SELECT p_turn, u.seq, u.last_seq, u.type, u.data, p_now
              FROM unnest(p_event_seqs, p_event_lasts, p_event_types, p_event_datas)
                   AS u(seq, last_seq, type, data);
            outcome := 'written';
        END
        $$;
        """,
    ),
    (
        13,
        """
        -- The owner's turns under way without walking the owner's sessions: a row per
        -- session with queued or running turns (live: how many), kept by a trigger on every
        -- change of a turn's status, so no writer can forget it. Every such change is made
        -- under the session's row lock (connection.py: fencing is the row lock), so the
        -- trigger's writes to its session's row here are serialized with them and add no
        -- lock order of their own. Admission counts the owner's rows (tens, not the 100,000
        -- sessions an owner may keep).
        -- No turn changes status from here to commit (a process of the previous release
        -- included): a change committed between the count below and the trigger would be
        -- missed by both, and counted wrong for good.
        LOCK TABLE turns IN SHARE ROW EXCLUSIVE MODE;
        CREATE TABLE busy_sessions (
            session_pk  bigint PRIMARY KEY REFERENCES sessions (pk) ON DELETE CASCADE,
            tenant      text NOT NULL,
            owner       text NOT NULL,
            live        integer NOT NULL CHECK (live > 0)
        );
        CREATE INDEX busy_sessions_by_owner ON busy_sessions (tenant, owner);
        INSERT INTO busy_sessions (session_pk, tenant, owner, live)
        SELECT s.pk, s.tenant, s.owner, count(*)
          FROM turns t JOIN sessions s ON s.pk = t.session_pk
         WHERE t.status IN ('queued', 'running')
         GROUP BY s.pk, s.tenant, s.owner;
        CREATE FUNCTION tether_count_busy() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            v_delta integer := 0;
        BEGIN
            IF TG_OP <> 'DELETE' AND NEW.status IN ('queued', 'running') THEN
                v_delta := 1;
            END IF;
            IF TG_OP <> 'INSERT' AND OLD.status IN ('queued', 'running') THEN
                v_delta := v_delta - 1;
            END IF;
            IF v_delta > 0 THEN
                INSERT INTO busy_sessions (session_pk, tenant, owner, live)
                SELECT s.pk, s.tenant, s.owner, 1 FROM sessions s WHERE s.pk = NEW.session_pk
                    ON CONFLICT (session_pk) DO UPDATE SET live = busy_sessions.live + 1;
            ELSIF v_delta < 0 THEN
                DELETE FROM busy_sessions WHERE session_pk = OLD.session_pk AND live <= 1;
                IF NOT FOUND THEN
                    UPDATE busy_sessions SET live = live - 1 WHERE session_pk = OLD.session_pk;
                END IF;
            END IF;
            RETURN NULL;
        END
        $$;
        CREATE TRIGGER turns_count_busy AFTER INSERT OR DELETE OR UPDATE OF status ON turns
            FOR EACH ROW EXECUTE FUNCTION tether_count_busy();
        -- tether_owner_active and tether_enqueue as migration 9's, counting busy_sessions.
        CREATE OR REPLACE FUNCTION tether_owner_active(p_tenant text, p_owner text,
                                                       OUT busy bigint, OUT active bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || chr(31) || p_owner, 7));
            SELECT count(*), coalesce(sum(b.live), 0) INTO busy, active
              FROM busy_sessions b WHERE b.tenant = p_tenant AND b.owner = p_owner;
        END
        $$;
        CREATE OR REPLACE FUNCTION tether_enqueue(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_active boolean;
        BEGIN
            SELECT s.pk, s.expires_at INTO v_pk, expires_at FROM sessions s
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
            outcome := 'queued';
        END
        $$;
        """,
    ),
    (
        14,
        """
        -- tether_enqueue as migration 13's, and a turn queued on a session another process
        -- holds the lease of is announced to it (channel tether_queued, payload tenant, owner
        -- and session id joined by chr(31)): its worker, lingering on the lease, hears of the
        -- turn instead of polling the queue. p_by is the submitting process's lease owner; a
        -- lease of its own needs no notice (the process wakes its worker itself), and a NOTIFY
        -- per turn would serialize every commit on PostgreSQL's notify queue lock. A new
        -- overload: a process of the previous release goes on calling the 17-argument one.
        CREATE OR REPLACE FUNCTION tether_enqueue(
            p_tenant text, p_owner text, p_session text, p_turn text, p_input text,
            p_policy text, p_now double precision, p_agent text, p_fingerprint text,
            p_idem text, p_digest text, p_max_queue bigint, p_limits boolean,
            p_running bigint, p_queued bigint, p_event_seq bigint, p_event_type text,
            p_by text, OUT outcome text, OUT turn_seq bigint, OUT expires_at double precision,
            OUT active_ids text[], OUT active_statuses text[], OUT busy bigint,
            OUT total bigint)
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
            IF v_holder IS NOT NULL AND v_held_until > p_now
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
]

END_RELEASING: list[tuple[int, str]] = [
    (
        23,
        """
        -- tether_end, and then, with no other turn of the session active, the session's lease
        -- given up as queries.RELEASE_LEASE gives it up, in the same statement (ReleasingEnd).
        -- tether_end locked the session's row (FOR UPDATE) in this transaction, so a turn
        -- admitted meanwhile either committed before it (and is seen here: the lease stays
        -- for it) or waits for this commit (and finds the lease free).
        CREATE FUNCTION tether_end_release(
            p_tenant text, p_owner text, p_session text, p_token bigint, p_turn text,
            p_now double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            p_effect text, p_status text, p_reason text, p_error text, p_output text,
            p_complete boolean, p_usage text, p_ran_by text,
            OUT outcome text, OUT current_token bigint, OUT first_seq bigint,
            OUT last_event bigint, OUT turn_seq bigint, OUT turn_input text,
            OUT turn_policy text, OUT turn_created double precision,
            OUT turn_started double precision, OUT turn_agent text, OUT turn_fingerprint text,
            OUT released boolean)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
        BEGIN
            SELECT e.outcome, e.current_token, e.first_seq, e.last_event, e.turn_seq,
                   e.turn_input, e.turn_policy, e.turn_created, e.turn_started, e.turn_agent,
                   e.turn_fingerprint
              INTO outcome, current_token, first_seq, last_event, turn_seq, turn_input,
                   turn_policy, turn_created, turn_started, turn_agent, turn_fingerprint
              FROM tether_end(p_tenant, p_owner, p_session, p_token, p_turn, p_now, p_kinds,
                              p_contents, p_completes, p_call_ids, p_tools, p_arguments,
                              p_metas, p_event_seqs, p_event_lasts, p_event_types,
                              p_event_datas, p_effect, p_status, p_reason, p_error, p_output,
                              p_complete, p_usage, p_ran_by) e;
            released := false;
            IF outcome <> 'ended' THEN
                RETURN;
            END IF;
            SELECT s.pk INTO v_pk FROM sessions s
             WHERE s.tenant = p_tenant AND s.owner = p_owner AND s.session_id = p_session;
            PERFORM 1 FROM turns t
             WHERE t.session_pk = v_pk AND t.status IN ('queued', 'running', 'awaiting_input');
            IF NOT FOUND THEN
                UPDATE sessions SET lease_owner = NULL, lease_expires_at = 0
                 WHERE pk = v_pk AND lease_token = p_token;
                released := true;
            END IF;
        END
        $$;
        """,
    ),
]
"""Migration 23: a running turn's ending that also gives the lease up (after IDLE_TTL's)."""

END_RELEASING_AT_ONCE: list[tuple[int, str]] = [
    (
        25,
        """
        -- tether_end_release as migration 23's in one body: the ending's checks and writes as
        -- tether_end makes them, in its order, and the lease given up by the same update of
        -- the session's row that numbers the items (12 statements, 9 now; the row updated
        -- once where it was twice). Whether the lease goes is asked after the row lock, of the
        -- turns but this one and of the status it ends in, as migration 23 asked of them all
        -- after the ending: a turn admitted meanwhile either committed before the lock (and
        -- is seen: the lease stays for it) or waits for this commit.
        CREATE OR REPLACE FUNCTION tether_end_release(
            p_tenant text, p_owner text, p_session text, p_token bigint, p_turn text,
            p_now double precision,
            p_kinds text[], p_contents text[], p_completes boolean[], p_call_ids text[],
            p_tools text[], p_arguments text[], p_metas text[],
            p_event_seqs bigint[], p_event_lasts bigint[], p_event_types text[],
            p_event_datas text[],
            p_effect text, p_status text, p_reason text, p_error text, p_output text,
            p_complete boolean, p_usage text, p_ran_by text,
            OUT outcome text, OUT current_token bigint, OUT first_seq bigint,
            OUT last_event bigint, OUT turn_seq bigint, OUT turn_input text,
            OUT turn_policy text, OUT turn_created double precision,
            OUT turn_started double precision, OUT turn_agent text, OUT turn_fingerprint text,
            OUT released boolean)
        LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            v_pk bigint;
            v_count integer := cardinality(p_kinds);
        BEGIN
            released := false;
            SELECT s.pk, s.lease_token INTO v_pk, current_token FROM sessions s
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
            -- Every refusal comes before the first write: a RETURN commits what was done.
            SELECT t.seq, t.input, t.policy, t.created_at, t.started_at, t.agent,
                   t.agent_fingerprint
              INTO turn_seq, turn_input, turn_policy, turn_created, turn_started, turn_agent,
                   turn_fingerprint
              FROM turns t WHERE t.id = p_turn AND t.session_pk = v_pk AND t.status = 'running';
            IF NOT FOUND THEN
                outcome := 'status';
                RETURN;
            END IF;
            IF cardinality(p_event_seqs) > 0 THEN
                SELECT COALESCE(MAX(COALESCE(e.last_seq, e.seq)), 0) INTO last_event
                  FROM events e WHERE e.turn_id = p_turn;
                IF (SELECT min(x) FROM unnest(p_event_seqs) x) <= last_event THEN
                    outcome := 'events';
                    RETURN;
                END IF;
            END IF;
            released := coalesce(p_status NOT IN ('queued', 'running', 'awaiting_input'), false)
                AND NOT EXISTS (
                    SELECT 1 FROM turns t WHERE t.session_pk = v_pk AND t.id <> p_turn
                       AND t.status IN ('queued', 'running', 'awaiting_input'));
            IF v_count > 0 THEN
                UPDATE sessions SET next_item_seq = next_item_seq + v_count, updated_at = p_now,
                       lease_owner = CASE WHEN released THEN NULL ELSE lease_owner END,
                       lease_expires_at = CASE WHEN released THEN 0 ELSE lease_expires_at END
                 WHERE pk = v_pk RETURNING next_item_seq - v_count INTO first_seq;
                INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,
                                   tool_name, arguments, meta, created_at)
                SELECT v_pk, first_seq + u.n - 1, p_turn, u.kind, u.content, u.complete,
                       u.call_id, u.tool_name, u.arguments, u.meta, p_now
                  FROM unnest(p_kinds, p_contents, p_completes, p_call_ids, p_tools,
                              p_arguments, p_metas)
                       WITH ORDINALITY AS u(kind, content, complete, call_id, tool_name,
                                            arguments, meta, n);
            ELSIF released THEN
                UPDATE sessions SET lease_owner = NULL, lease_expires_at = 0 WHERE pk = v_pk;
            END IF;
            INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)
            SELECT p_turn, u.seq, u.last_seq, u.type, u.data, p_now
              FROM unnest(p_event_seqs, p_event_lasts, p_event_types, p_event_datas)
                   AS u(seq, last_seq, type, data);
            IF p_effect = 'delete' THEN
                DELETE FROM items WHERE session_pk = v_pk AND turn_id = p_turn;
            ELSIF p_effect = 'exclude' THEN
                UPDATE items SET excluded = true WHERE session_pk = v_pk AND turn_id = p_turn;
            END IF;
            UPDATE turns SET status = p_status, reason = p_reason, error = p_error,
                   output = p_output, complete = p_complete, usage = p_usage, ended_at = p_now,
                   ran_by = p_ran_by, held_memory = NULL
             WHERE id = p_turn;
            outcome := 'ended';
        END
        $$;
        """,
    ),
]
"""Migration 25: that ending in one body (after TAKEN_AT_ONCE's)."""
