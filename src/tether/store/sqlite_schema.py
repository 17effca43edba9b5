"""Versioned SQLite migrations. Append only: a released migration is never edited."""

from __future__ import annotations

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
]
