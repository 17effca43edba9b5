"""The PostgreSQL store's statements for memory records, knowledge documents and forget."""

from __future__ import annotations

from tether.store.rows import DOCUMENT_COLS, DOCUMENT_INSERT_COLS, INSERT_COLS, RECORD_COLS
from tether.store.rules import PERSONAL_SCOPES

# The column types of INSERT_COLS: twelve texts, the revision, two times, the embedding.
RECORD_TYPES = ("text",) * 12 + ("bigint", "float8", "float8", "bytea")
ARRAYS = ", ".join(f"${n}::{t}[]" for n, t in enumerate(RECORD_TYPES, 1))
INSERT_RECORDS = (
    f"INSERT INTO memory ({INSERT_COLS}) SELECT {INSERT_COLS}"
    f" FROM unnest({ARRAYS}) WITH ORDINALITY AS u({INSERT_COLS}, n) ORDER BY n"
    " RETURNING id, seq"
)
BUMP = (
    "INSERT INTO memory_versions (ns, collection, scope, tenant, owner, version)"
    " SELECT u.ns, u.collection, u.scope, u.tenant, u.owner, nextval('memory_clock')"
    " FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) WITH ORDINALITY"
    " AS u(ns, collection, scope, tenant, owner, n) ORDER BY u.n"
    " ON CONFLICT (ns, collection) DO UPDATE SET version = excluded.version"
)
VERSION = "SELECT version FROM memory_versions WHERE ns = $1 AND collection = $2"
# ``owner IN ($2, '')`` walks memory_by_owner for both halves: the user's own namespaces, and the
# shared ones (no owner), where only the rows they wrote count.
STORAGE_USED = (
    "SELECT COALESCE(SUM(octet_length(content) + octet_length(embedding)), 0) FROM memory"
    " WHERE tenant = $1 AND owner IN ($2, '') AND (owner = $2 OR author = $2)"
)
RECORD_IN = f"SELECT {RECORD_COLS} FROM memory WHERE id = $1 AND ns = ANY($2::text[])"
LOCATE = "SELECT ns FROM memory WHERE id = $1"
LIST_RECORDS = (
    f"SELECT {RECORD_COLS} FROM memory WHERE ns = ANY($1::text[]) AND collection = $2"
    " AND seq > $3 ORDER BY seq LIMIT $4"
)
RECORDS_BY_SEQ = (
    f"SELECT {RECORD_COLS} FROM memory WHERE seq = ANY($1::bigint[]) AND ns = ANY($2::text[])"
)
COLLECTION_OF = "SELECT collection FROM memory WHERE id = $1 AND ns = $2"
UPDATE_RECORD = (
    "UPDATE memory SET content = $3, kind = $4, embedding = $5, updated_at = $6,"
    f" revision = revision + 1 WHERE id = $1 AND ns = $2 AND revision = $7 RETURNING {RECORD_COLS}"
)
REVISION_OF = "SELECT revision FROM memory WHERE id = $1 AND ns = $2"
# Each term goes through plainto_tsquery, which reads it as plain words (nothing in it is ever
# an operator); the text forms of those queries are valid tsquery syntax and are OR-ed, then
# cast rather than parsed by to_tsquery, which would stem the already stemmed lexemes again.
# Terms that are only stop words drop out; with none left the query is NULL and matches nothing.
# MATERIALIZED: without statistics (a fresh table) the planner otherwise inlines q and rebuilds
# the query once per row instead of using the GIN index (measured: 483 ms against 16 at 10k).
LEXICAL_SEARCH = (
    "WITH q AS MATERIALIZED"
    " (SELECT array_to_string(array_agg('(' || t.q::text || ')'), ' | ')::tsquery AS q"
    "  FROM (SELECT plainto_tsquery('english', term) AS q FROM unnest($1::text[]) AS term) t"
    "  WHERE numnode(t.q) > 0)"
    " SELECT m.seq FROM memory m, q WHERE m.tsv @@ q.q AND m.ns = ANY($2::text[])"
    " AND m.collection = $3 ORDER BY ts_rank_cd(m.tsv, q.q) DESC, m.seq DESC LIMIT $4"
)
VECTORS = "SELECT seq, embedding FROM memory WHERE ns = $1 AND collection = $2 ORDER BY seq"
INSERT_DOCUMENT = (
    f"INSERT INTO documents ({DOCUMENT_INSERT_COLS})"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
)
LIST_DOCUMENTS = (
    f"SELECT {DOCUMENT_COLS} FROM documents WHERE ns = $1"
    " AND ($2::text IS NULL OR collection = $2) ORDER BY seq"
)
DELETE_DOCUMENT = "DELETE FROM documents WHERE id = $1 AND ns = $2 AND collection = $3 RETURNING id"
MINE = (
    "tenant = $1 AND owner = $2 AND scope IN (" + ", ".join(f"'{s}'" for s in PERSONAL_SCOPES) + ")"
)
VERSIONS = "SELECT ns, version FROM memory_versions WHERE collection = $1 AND ns = ANY($2::text[])"
PAIRS_WHERE = "SELECT DISTINCT ns, collection FROM memory WHERE {where}"
DELETE_WHERE = (
    "WITH gone AS (DELETE FROM memory WHERE {where} RETURNING ns, collection)"
    " SELECT ns, collection, count(*) FROM gone GROUP BY ns, collection"
)
WHERE_RECORD = "id = $1 AND ns = $2"
WHERE_AUTHORS = "ns = $1 AND collection = '' AND author = ANY($2::text[])"
WHERE_NAMESPACE = "ns = $1"
WHERE_COLLECTION = "ns = $1 AND collection = $2"
WHERE_DOCUMENT = "document_id = $1 AND ns = $2 AND collection = $3"
DELETE_NAMESPACE_DOCUMENTS = "DELETE FROM documents WHERE ns = $1"
DELETE_NAMESPACE_VERSIONS = "DELETE FROM memory_versions WHERE ns = $1"
DELETE_COLLECTION_DOCUMENTS = "DELETE FROM documents WHERE ns = $1 AND collection = $2"
FORGET_SESSIONS = "DELETE FROM sessions WHERE tenant = $1 AND owner = $2"
FORGET_VERSIONS = f"DELETE FROM memory_versions WHERE {MINE}"
FORGET_RECORDS = f"DELETE FROM memory WHERE {MINE}"
FORGET_DOCUMENTS = f"DELETE FROM documents WHERE {MINE}"
