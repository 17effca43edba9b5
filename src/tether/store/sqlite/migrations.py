"""Versioned SQLite migrations and how they are applied.

Append only: a released migration is never edited. Each process applies what is missing when it
opens the file, inside one ``BEGIN IMMEDIATE``, so processes starting together take turns.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE sessions (
            pk              INTEGER PRIMARY KEY,
            tenant          TEXT NOT NULL,
            owner           TEXT NOT NULL,
            session_id      TEXT NOT NULL,
            agent           TEXT NOT NULL,
            metadata        TEXT NOT NULL DEFAULT '{}',
            state           TEXT NOT NULL DEFAULT '{}',
            created_at      REAL NOT NULL,
            updated_at      REAL NOT NULL,
            expires_at      REAL,
            revision        INTEGER NOT NULL DEFAULT 1,
            next_turn_seq   INTEGER NOT NULL DEFAULT 1,
            next_item_seq   INTEGER NOT NULL DEFAULT 1,
            lease_owner     TEXT,
            lease_token     INTEGER NOT NULL DEFAULT 0,
            lease_expires_at REAL NOT NULL DEFAULT 0,
            UNIQUE (tenant, owner, session_id)
        );
        CREATE TABLE turns (
            id          TEXT PRIMARY KEY,
            session_pk  INTEGER NOT NULL REFERENCES sessions(pk) ON DELETE CASCADE,
            seq         INTEGER NOT NULL,
            input       TEXT NOT NULL,
            policy      TEXT NOT NULL,
            status      TEXT NOT NULL,
            reason      TEXT,
            error       TEXT,
            output      TEXT,
            complete    INTEGER NOT NULL DEFAULT 0,
            usage       TEXT NOT NULL DEFAULT '{}',
            created_at  REAL NOT NULL,
            started_at  REAL,
            ended_at    REAL,
            UNIQUE (session_pk, seq)
        );
        -- Per-session lookups by status (queued, running) are index probes, however many
        -- turns a session has had, and the partial index serves the global "who has work" scan.
        CREATE INDEX turns_by_status ON turns (session_pk, status, seq);
        CREATE INDEX turns_active ON turns (session_pk, seq)
            WHERE status IN ('queued', 'running');
        CREATE TABLE items (
            session_pk  INTEGER NOT NULL REFERENCES sessions(pk) ON DELETE CASCADE,
            seq         INTEGER NOT NULL,
            turn_id     TEXT NOT NULL,
            kind        TEXT NOT NULL,
            content     TEXT NOT NULL,
            complete    INTEGER NOT NULL,
            call_id     TEXT,
            tool_name   TEXT,
            arguments   TEXT,
            meta        TEXT NOT NULL DEFAULT '{}',
            excluded    INTEGER NOT NULL DEFAULT 0,
            created_at  REAL NOT NULL,
            PRIMARY KEY (session_pk, seq)
        ) WITHOUT ROWID;
        CREATE INDEX items_turn ON items (turn_id);
        -- A row is one event, or a run of message.delta events with consecutive seqs from
        -- seq to last_seq (data holds their texts): a streamed reply is a row per commit.
        CREATE TABLE events (
            turn_id     TEXT NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
            seq         INTEGER NOT NULL,
            last_seq    INTEGER,
            type        TEXT NOT NULL,
            data        TEXT NOT NULL,
            created_at  REAL NOT NULL,
            PRIMARY KEY (turn_id, seq)
        ) WITHOUT ROWID;
        """,
    ),
    (
        2,
        """
        CREATE TABLE api_keys (
            id          TEXT PRIMARY KEY,
            tenant      TEXT NOT NULL,
            user_id     TEXT NOT NULL,
            roles       TEXT NOT NULL,
            hash        TEXT NOT NULL UNIQUE,
            created_at  REAL NOT NULL,
            revoked_at  REAL
        );
        """,
    ),
    (
        3,
        """
        -- A request from any process to end a running turn, as JSON {"status", "reason"}:
        -- the process that owns the turn polls for it and ends the turn itself.
        ALTER TABLE turns ADD COLUMN cancel_request TEXT;
        """,
    ),
    (
        4,
        """
        -- Memory items (collection '') and knowledge chunks (a collection and a document) of
        -- every namespace. seq is AUTOINCREMENT so it is never reused: a listing cursor or a
        -- search result naming a deleted record can never come to name a newer one.
        CREATE TABLE memory (
            seq         INTEGER PRIMARY KEY AUTOINCREMENT,
            id          TEXT NOT NULL UNIQUE,
            ns          TEXT NOT NULL,
            scope       TEXT NOT NULL,
            tenant      TEXT NOT NULL,
            owner       TEXT NOT NULL,
            collection  TEXT NOT NULL,
            document_id TEXT,
            kind        TEXT NOT NULL,
            content     TEXT NOT NULL,
            meta        TEXT NOT NULL DEFAULT '{}',
            turn_id     TEXT,
            author      TEXT,
            revision    INTEGER NOT NULL DEFAULT 1,
            created_at  REAL NOT NULL,
            updated_at  REAL NOT NULL,
            embedding   BLOB NOT NULL
        );
        CREATE INDEX memory_by_ns ON memory (ns, collection, seq);
        CREATE INDEX memory_by_owner ON memory (tenant, owner);
        CREATE INDEX memory_by_document ON memory (document_id) WHERE document_id IS NOT NULL;
        CREATE INDEX memory_by_turn ON memory (turn_id) WHERE turn_id IS NOT NULL;
        -- External content: the text lives once, in memory. The store keeps the index in step
        -- in the same transaction as every insert, update and delete of a record.
        CREATE VIRTUAL TABLE memory_fts USING fts5 (
            content, content='memory', content_rowid='seq', tokenize='porter unicode61'
        );
        CREATE TABLE documents (
            seq         INTEGER PRIMARY KEY AUTOINCREMENT,
            id          TEXT NOT NULL UNIQUE,
            ns          TEXT NOT NULL,
            scope       TEXT NOT NULL,
            tenant      TEXT NOT NULL,
            owner       TEXT NOT NULL,
            collection  TEXT NOT NULL,
            name        TEXT NOT NULL,
            media_type  TEXT NOT NULL,
            chunks      INTEGER NOT NULL,
            chars       INTEGER NOT NULL,
            created_at  REAL NOT NULL,
            meta        TEXT NOT NULL DEFAULT '{}'
        );
        CREATE INDEX documents_by_ns ON documents (ns, collection, seq);
        CREATE INDEX documents_by_owner ON documents (tenant, owner);
        -- The version of each (namespace, collection): set from memory_clock, which only grows,
        -- by every write to a record of it, so a value is never seen twice and a row may be
        -- deleted (forget) without its next version repeating one a cache still holds.
        -- No row means the pair holds no record.
        CREATE TABLE memory_versions (
            ns          TEXT NOT NULL,
            collection  TEXT NOT NULL,
            scope       TEXT NOT NULL,
            tenant      TEXT NOT NULL,
            owner       TEXT NOT NULL,
            version     INTEGER NOT NULL,
            PRIMARY KEY (ns, collection)
        ) WITHOUT ROWID;
        CREATE INDEX memory_versions_by_owner ON memory_versions (tenant, owner);
        CREATE TABLE memory_clock (value INTEGER NOT NULL);
        -- The newest summary of a long session without walking all of its items.
        CREATE INDEX items_summaries ON items (session_pk, seq) WHERE kind = 'summary';
        INSERT INTO memory_clock (value) VALUES (0);
        """,
    ),
    (
        5,
        """
        -- The agent each turn was submitted for (name and a digest of its definition): a
        -- session may be served by several agents, and a turn runs exactly its own.
        ALTER TABLE turns ADD COLUMN agent TEXT;
        ALTER TABLE turns ADD COLUMN agent_fingerprint TEXT;
        """,
    ),
    (
        6,
        """
        -- A submission's idempotency key (unique per session) and a digest of what it asked:
        -- a retry with the key is answered with its turn; the key with another request is 422.
        ALTER TABLE turns ADD COLUMN idempotency_key TEXT;
        ALTER TABLE turns ADD COLUMN request_digest TEXT;
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
            session_pk  INTEGER NOT NULL REFERENCES sessions(pk) ON DELETE CASCADE,
            turn_id     TEXT NOT NULL REFERENCES turns(id) ON DELETE CASCADE,
            call_id     TEXT NOT NULL,
            kind        TEXT NOT NULL,
            payload     TEXT NOT NULL,
            status      TEXT NOT NULL,
            answer      TEXT,
            decided_by  TEXT,
            created_at  REAL NOT NULL,
            deadline    REAL NOT NULL,
            decided_at  REAL,
            PRIMARY KEY (turn_id, call_id)
        );
        CREATE INDEX decisions_by_session ON decisions (session_pk, created_at);
        -- The deadline sweep and its next wake-up read only the pending ones.
        CREATE INDEX decisions_pending ON decisions (deadline) WHERE status = 'pending';
        -- The memory writes a parked turn holds until it ends (JSON, rules.held_memory_json).
        ALTER TABLE turns ADD COLUMN held_memory TEXT;
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
        ALTER TABLE turns ADD COLUMN ran_by TEXT;
        """,
    ),
    (
        9,
        """
        -- The owner's turns under way without walking every active turn of every owner: each
        -- turn names its session's owner, and a partial index holds the queued and running
        -- ones by owner. Admission counted them through turns_active, the active turns of all
        -- owners, parked ones too (10,000 turns of other users under way: 5 ms an admission,
        -- under the write lock); now it walks the owner's own (at most its bounds).
        -- Terminal turns keep NULL: they never run again, and no index holds them. A turn
        -- inserted without them (by a process of the previous release on the same file) is
        -- given them by the trigger, so that it counts.
        ALTER TABLE turns ADD COLUMN tenant TEXT;
        ALTER TABLE turns ADD COLUMN owner TEXT;
        UPDATE turns
           SET (tenant, owner) = (SELECT s.tenant, s.owner FROM sessions s
                                   WHERE s.pk = turns.session_pk)
         WHERE status IN ('queued', 'running', 'awaiting_input');
        CREATE INDEX turns_owner_busy ON turns (tenant, owner, session_pk)
            WHERE status IN ('queued', 'running');
        CREATE TRIGGER turns_owner_named AFTER INSERT ON turns WHEN NEW.tenant IS NULL
        BEGIN
            UPDATE turns
               SET (tenant, owner) = (SELECT s.tenant, s.owner FROM sessions s
                                       WHERE s.pk = NEW.session_pk)
             WHERE id = NEW.id;
        END;
        """,
    ),
    (
        10,
        """
        -- The expiry sweep reads the expired sessions only: it read every session with a TTL
        -- (10 ms at 100,000 sessions, every minute, under the write lock).
        CREATE INDEX sessions_expiring ON sessions (expires_at) WHERE expires_at IS NOT NULL;
        """,
    ),
    (
        11,
        """
        -- A session whose TTL counts from its latest activity (a one-off the OpenAI face made,
        -- which its client may go on with for months): idle_ttl, and its expiry moved with
        -- every write that moves updated_at, by whichever process (or release) writes.
        ALTER TABLE sessions ADD COLUMN idle_ttl REAL;
        CREATE TRIGGER sessions_idle_expiry AFTER UPDATE OF updated_at ON sessions
        WHEN NEW.idle_ttl IS NOT NULL
        BEGIN
            UPDATE sessions SET expires_at = NEW.updated_at + NEW.idle_ttl WHERE pk = NEW.pk;
        END;
        """,
    ),
    (
        12,
        """
        -- An update that sets the expiry itself gives the session a TTL of its own, whoever
        -- makes it: migration 11's trigger moved it back to the latest activity when the
        -- update came from a process of the previous release (which does not clear idle_ttl).
        DROP TRIGGER sessions_idle_expiry;
        CREATE TRIGGER sessions_idle_expiry AFTER UPDATE OF updated_at ON sessions
        WHEN NEW.idle_ttl IS NOT NULL
        BEGIN
            UPDATE sessions SET idle_ttl = NULL
             WHERE pk = NEW.pk AND NEW.expires_at IS NOT OLD.expires_at;
            UPDATE sessions SET expires_at = NEW.updated_at + NEW.idle_ttl
             WHERE pk = NEW.pk AND NEW.expires_at IS OLD.expires_at;
        END;
        """,
    ),
]


def statements(sql: str) -> list[str]:
    """Split a migration into statements; ``--`` comments go first (they may hold a ';'). A
    trigger's body holds ';' too: pieces are joined until SQLite says a statement is whole."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    out: list[str] = []
    pending = ""
    for piece in "\n".join(lines).split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n;"):
                out.append(pending.strip().removesuffix(";").strip())
            pending = ""
    if pending.strip(" \n;"):
        out.append(pending.strip().removesuffix(";").strip())
    return out


def migrate(conn: sqlite3.Connection) -> tuple[int, int]:
    """Apply the migrations the file lacks; its schema version before and after."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        current = now = row[0] or 0
        for version, sql in MIGRATIONS:
            if version > current:
                for statement in statements(sql):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
                now = version
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return current, now
