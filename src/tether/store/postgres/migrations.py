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

from tether.store.postgres.functions import END_RELEASING, END_RELEASING_AT_ONCE, FUNCTIONS
from tether.store.postgres.session_functions import IDLE_TTL, SESSION_FUNCTIONS, TAKEN_AT_ONCE
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
    *FUNCTIONS,  # 9 on: the stored functions (functions.py)
    *SESSION_FUNCTIONS,  # 15 on: those for sessions (session_functions.py)
    (
        20,
        """
        -- The expiry sweep reads the expired sessions only: it read every session with a TTL
        -- (16 ms at 100,000 sessions, every minute, in every process). Built under a lock
        -- that holds the sessions' writes for as long as it takes, once.
        CREATE INDEX sessions_expiring ON sessions (expires_at) WHERE expires_at IS NOT NULL;
        """,
    ),
    *IDLE_TTL,  # 21, 22: TTLs that count from the latest activity (session_functions.py)
    *END_RELEASING,  # 23: an ending that gives the lease up (functions.py)
    *TAKEN_AT_ONCE,  # 24: an idle session's turn started in one body (session_functions.py)
    *END_RELEASING_AT_ONCE,  # 25: the ending that gives the lease up, in one body (functions.py)
]


async def migrate(conn: Conn) -> tuple[int, int]:
    """Apply the migrations the database lacks; its schema version before and after."""
    # Server processes starting together on a fresh database take turns on this lock; the
    # later ones find every migration recorded. READ COMMITTED matters here: the version
    # read after the lock must see what the previous holder committed.
    async with conn.transaction(isolation="read_committed"):
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(VERSION_TABLE)
        current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        now = current
        for version, sql in MIGRATIONS:
            if version > current:
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                    version,
                    time.time(),
                )
                now = version
    return int(current), int(now)
