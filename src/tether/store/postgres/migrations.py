"""Versioned PostgreSQL migrations and how they are applied.

``MIGRATIONS`` is versioned like the SQLite one and append only: a released migration is never
edited. The schema is SQLite's, with PostgreSQL types: timestamps are ``double precision`` epoch
seconds, JSON is kept as ``text`` (exactly what ``json.dumps`` wrote; ``jsonb`` would reorder keys
and refuse ``\\u0000``), and the text columns that are ordered or compared carry
``COLLATE "C"`` so they sort by bytes whatever the database's locale, as SQLite and the memory
store do.
"""

from __future__ import annotations

import time

from tether.store.postgres.steps import Conn

MIGRATION_LOCK = 0x7465_7468_6572_0001
"""Key of the ``pg_advisory_xact_lock`` held while migrating (``"tether"`` and a 1)."""

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version     integer PRIMARY KEY,
    applied_at  double precision NOT NULL
)
"""

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE sessions (
            pk               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            tenant           text COLLATE "C" NOT NULL,
            owner            text COLLATE "C" NOT NULL,
            session_id       text COLLATE "C" NOT NULL,
            agent            text NOT NULL,
            metadata         text NOT NULL DEFAULT '{}',
            state            text NOT NULL DEFAULT '{}',
            created_at       double precision NOT NULL,
            updated_at       double precision NOT NULL,
            expires_at       double precision,
            revision         bigint NOT NULL DEFAULT 1,
            next_turn_seq    bigint NOT NULL DEFAULT 1,
            next_item_seq    bigint NOT NULL DEFAULT 1,
            lease_owner      text,
            lease_token      bigint NOT NULL DEFAULT 0,
            lease_expires_at double precision NOT NULL DEFAULT 0,
            UNIQUE (tenant, owner, session_id)
        );
        CREATE TABLE turns (
            id          text COLLATE "C" PRIMARY KEY,
            session_pk  bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
            seq         bigint NOT NULL,
            input       text NOT NULL,
            policy      text NOT NULL,
            status      text NOT NULL,
            reason      text,
            error       text,
            output      text,
            complete    boolean NOT NULL DEFAULT false,
            usage       text NOT NULL DEFAULT '{}',
            created_at  double precision NOT NULL,
            started_at  double precision,
            ended_at    double precision,
            UNIQUE (session_pk, seq)
        );
        -- Per-session lookups by status are index probes however many turns a session has
        -- had; the partial index serves the global "who has work" scan.
        CREATE INDEX turns_by_status ON turns (session_pk, status, seq);
        CREATE INDEX turns_active ON turns (session_pk, seq)
            WHERE status IN ('queued', 'running');
        CREATE TABLE items (
            session_pk  bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
            seq         bigint NOT NULL,
            turn_id     text COLLATE "C" NOT NULL,
            kind        text NOT NULL,
            content     text NOT NULL,
            complete    boolean NOT NULL,
            call_id     text,
            tool_name   text,
            arguments   text,
            meta        text NOT NULL DEFAULT '{}',
            excluded    boolean NOT NULL DEFAULT false,
            created_at  double precision NOT NULL,
            PRIMARY KEY (session_pk, seq)
        );
        CREATE INDEX items_turn ON items (session_pk, turn_id);
        -- A row is one event, or a run of message.delta events with consecutive seqs from
        -- seq to last_seq (data holds their texts): a streamed reply is a row per commit.
        CREATE TABLE events (
            turn_id     text COLLATE "C" NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
            seq         bigint NOT NULL,
            last_seq    bigint,
            type        text NOT NULL,
            data        text NOT NULL,
            created_at  double precision NOT NULL,
            PRIMARY KEY (turn_id, seq)
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE api_keys (
            id          text COLLATE "C" PRIMARY KEY,
            tenant      text NOT NULL,
            user_id     text NOT NULL,
            roles       text NOT NULL,
            hash        text COLLATE "C" NOT NULL UNIQUE,
            created_at  double precision NOT NULL,
            revoked_at  double precision
        );
        """,
    ),
    (
        3,
        """
        ALTER TABLE turns ADD COLUMN cancel_request text;
        """,
    ),
    (
        4,
        """
        -- Memory items (collection '') and knowledge chunks (a collection and a document) of
        -- every namespace; tsv is the English lexical index of content, kept by PostgreSQL.
        CREATE TABLE memory (
            seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id           text COLLATE "C" NOT NULL UNIQUE,
            ns           text COLLATE "C" NOT NULL,
            scope        text NOT NULL,
            tenant       text COLLATE "C" NOT NULL,
            owner        text COLLATE "C" NOT NULL,
            collection   text COLLATE "C" NOT NULL,
            document_id  text COLLATE "C",
            kind         text NOT NULL,
            content      text NOT NULL,
            meta         text NOT NULL DEFAULT '{}',
            turn_id      text COLLATE "C",
            author       text COLLATE "C",
            revision     bigint NOT NULL DEFAULT 1,
            created_at   double precision NOT NULL,
            updated_at   double precision NOT NULL,
            embedding    bytea NOT NULL,
            tsv          tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED
        );
        CREATE INDEX memory_by_ns ON memory (ns, collection, seq);
        CREATE INDEX memory_by_owner ON memory (tenant, owner);
        CREATE INDEX memory_by_document ON memory (document_id) WHERE document_id IS NOT NULL;
        CREATE INDEX memory_by_turn ON memory (turn_id) WHERE turn_id IS NOT NULL;
        CREATE INDEX memory_tsv ON memory USING gin (tsv);
        CREATE TABLE documents (
            seq          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id           text COLLATE "C" NOT NULL UNIQUE,
            ns           text COLLATE "C" NOT NULL,
            scope        text NOT NULL,
            tenant       text COLLATE "C" NOT NULL,
            owner        text COLLATE "C" NOT NULL,
            collection   text COLLATE "C" NOT NULL,
            name         text NOT NULL,
            media_type   text NOT NULL,
            chunks       bigint NOT NULL,
            chars        bigint NOT NULL,
            created_at   double precision NOT NULL,
            meta         text NOT NULL DEFAULT '{}'
        );
        CREATE INDEX documents_by_ns ON documents (ns, collection, seq);
        CREATE INDEX documents_by_owner ON documents (tenant, owner);
        -- The version of each (namespace, collection), set from memory_clock by every write to
        -- a record of it: a value is never handed out twice, so a row may be deleted (forget)
        -- without a later version repeating one a cache still holds. No row: no record.
        CREATE TABLE memory_versions (
            ns           text COLLATE "C" NOT NULL,
            collection   text COLLATE "C" NOT NULL,
            scope        text NOT NULL,
            tenant       text COLLATE "C" NOT NULL,
            owner        text COLLATE "C" NOT NULL,
            version      bigint NOT NULL,
            PRIMARY KEY (ns, collection)
        );
        CREATE INDEX memory_versions_by_owner ON memory_versions (tenant, owner);
        CREATE SEQUENCE memory_clock;
        -- The newest summary of a long session without walking all of its items.
        CREATE INDEX items_summaries ON items (session_pk, seq) WHERE kind = 'summary';
        """,
    ),
    (
        5,
        """
        -- The agent each turn was submitted for (name and a digest of its definition): a
        -- session may be served by several agents, and a turn runs exactly its own.
        ALTER TABLE turns ADD COLUMN agent text, ADD COLUMN agent_fingerprint text;
        """,
    ),
    (
        6,
        """
        -- A submission's idempotency key (unique per session) and a digest of what it asked:
        -- a retry with the key is answered with its turn; the key with another request is 422.
        ALTER TABLE turns ADD COLUMN idempotency_key text, ADD COLUMN request_digest text;
        CREATE UNIQUE INDEX turns_idempotency ON turns (session_pk, idempotency_key)
            WHERE idempotency_key IS NOT NULL;
        """,
    ),
    (
        7,
        """
        -- Decisions a parked turn waits for (one per call it asked about). They go with their
        -- turn (clearing a session's history deletes its ended turns) and with their session.
        CREATE TABLE decisions (
            session_pk  bigint NOT NULL REFERENCES sessions (pk) ON DELETE CASCADE,
            turn_id     text COLLATE "C" NOT NULL REFERENCES turns (id) ON DELETE CASCADE,
            call_id     text COLLATE "C" NOT NULL,
            kind        text NOT NULL,
            payload     text NOT NULL,
            status      text NOT NULL,
            answer      text,
            decided_by  text,
            created_at  double precision NOT NULL,
            deadline    double precision NOT NULL,
            decided_at  double precision,
            PRIMARY KEY (turn_id, call_id)
        );
        CREATE INDEX decisions_by_session ON decisions (session_pk, created_at);
        -- The deadline sweep and its next wake-up read only the pending ones.
        CREATE INDEX decisions_pending ON decisions (deadline) WHERE status = 'pending';
        -- The memory writes a parked turn holds until it ends (JSON, rules.held_memory_json).
        ALTER TABLE turns ADD COLUMN held_memory text;
        -- A parked turn is active: it holds its session's place in order.
        DROP INDEX turns_active;
        CREATE INDEX turns_active ON turns (session_pk, seq)
            WHERE status IN ('queued', 'running', 'awaiting_input');
        """,
    ),
    (
        8,
        """
        -- The newest handoff of a session (which agent its next turn runs) without walking its
        -- items.
        CREATE INDEX items_handoffs ON items (session_pk, seq) WHERE kind = 'handoff';
        -- The agent a turn ended with: the one it was submitted for, or the one a handoff passed
        -- the conversation to.
        ALTER TABLE turns ADD COLUMN ran_by text;
        """,
    ),
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
]


async def migrate(conn: Conn) -> None:
    # Server processes starting together on a fresh database take turns on this lock; the
    # later ones find every migration recorded. READ COMMITTED matters here: the version
    # read after the lock must see what the previous holder committed.
    async with conn.transaction(isolation="read_committed"):
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(VERSION_TABLE)
        current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        for version, sql in MIGRATIONS:
            if version > current:
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                    version,
                    time.time(),
                )
