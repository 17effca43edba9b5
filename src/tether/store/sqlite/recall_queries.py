"""The SQLite store's statements for memory records, knowledge documents and forget.

``{ns}`` stands for a list of ``?`` placeholders, one per namespace key (see :func:`in_list`):
namespaces are few (at most four scopes), and an explicit list keeps the ``ns`` index usable.
"""

from __future__ import annotations

from tether.store.rows import DOCUMENT_COLS, DOCUMENT_INSERT_COLS, INSERT_COLS, RECORD_COLS
from tether.store.rules import PERSONAL_SCOPES


def in_list(n: int) -> str:
    """``?,?,…`` for ``n`` values."""
    return ",".join("?" * n)


BUMP_CLOCK = "UPDATE memory_clock SET value = value + 1 RETURNING value"
SET_VERSION = (
    "INSERT INTO memory_versions (ns, collection, scope, tenant, owner, version)"
    " VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (ns, collection) DO UPDATE SET version = excluded.version"
)
VERSION = "SELECT version FROM memory_versions WHERE ns = ? AND collection = ?"
# ``owner IN (?, '')`` walks memory_by_owner for both halves: the user's own namespaces, and the
# shared ones (no owner), where only the rows they wrote count.
STORAGE_USED = (
    "SELECT COALESCE(SUM(length(CAST(content AS BLOB)) + length(embedding)), 0) FROM memory"
    " WHERE tenant = ? AND owner IN (?, '') AND (owner = ? OR author = ?)"
)
VERSIONS = "SELECT ns, version FROM memory_versions WHERE collection = ? AND ns IN ({ns})"

INSERT_RECORD = f"INSERT INTO memory ({INSERT_COLS}) VALUES ({in_list(16)}) RETURNING seq"
INDEX_TEXT = "INSERT INTO memory_fts (rowid, content) VALUES (?, ?)"
# An external-content index forgets a row only when told its exact old text.
UNINDEX_TEXT = "INSERT INTO memory_fts (memory_fts, rowid, content) VALUES ('delete', ?, ?)"
RECORD_FOR_UPDATE = "SELECT seq, revision, collection, content FROM memory WHERE id = ? AND ns = ?"
UPDATE_RECORD = (
    "UPDATE memory SET content = ?, kind = ?, embedding = ?, updated_at = ?,"
    f" revision = revision + 1 WHERE seq = ? RETURNING {RECORD_COLS}"
)
FIND_RECORD = f"SELECT {RECORD_COLS} FROM memory WHERE id = ? AND ns IN ({{ns}})"
LOCATE = "SELECT ns FROM memory WHERE id = ?"
LIST_RECORDS = (
    f"SELECT {RECORD_COLS} FROM memory WHERE ns IN ({{ns}})"
    " AND collection = ? AND seq > ? ORDER BY seq LIMIT ?"
)
# json_each: any number of seqs in one parameter, whatever SQLite's variable limit; "+ns": look
# the rows up by seq rather than scan the ns index.
RECORDS_BY_SEQ = (
    f"SELECT {RECORD_COLS} FROM memory WHERE seq IN (SELECT value FROM json_each(?))"
    " AND +ns IN ({ns})"
)
# bm25 is smaller for better matches; among equals the newer record goes first.
LEXICAL_SEARCH = (
    "SELECT m.seq FROM memory_fts JOIN memory m ON m.seq = memory_fts.rowid"
    " WHERE memory_fts MATCH ? AND m.ns IN ({ns})"
    " AND m.collection = ? ORDER BY bm25(memory_fts), m.seq DESC LIMIT ?"
)
VECTORS = "SELECT seq, embedding FROM memory WHERE ns = ? AND collection = ? ORDER BY seq"

# The deletions go through delete_where: these are its WHERE clauses.
WHERE_RECORD = "id = ? AND ns = ?"
WHERE_AUTHORS = "ns = ? AND collection = '' AND author IN (?, ?)"
WHERE_NAMESPACE = "ns = ?"
WHERE_COLLECTION = "ns = ? AND collection = ?"
WHERE_DOCUMENT = "document_id = ? AND ns = ? AND collection = ?"
WHERE_PERSONAL = (
    "tenant = ? AND owner = ? AND scope IN (" + ", ".join(f"'{s}'" for s in PERSONAL_SCOPES) + ")"
)
PAIRS_WHERE = "SELECT DISTINCT ns, collection FROM memory WHERE {where}"
UNINDEX_WHERE = (
    "INSERT INTO memory_fts (memory_fts, rowid, content)"
    " SELECT 'delete', seq, content FROM memory WHERE {where}"
)
DELETE_WHERE = "DELETE FROM memory WHERE {where}"

INSERT_DOCUMENT = f"INSERT INTO documents ({DOCUMENT_INSERT_COLS}) VALUES ({in_list(12)})"
LIST_DOCUMENTS = (
    f"SELECT {DOCUMENT_COLS} FROM documents WHERE ns = ?"
    " AND (? IS NULL OR collection = ?) ORDER BY seq"
)
DELETE_DOCUMENT = "DELETE FROM documents WHERE id = ? AND ns = ? AND collection = ?"
DELETE_NAMESPACE_DOCUMENTS = "DELETE FROM documents WHERE ns = ?"
DELETE_NAMESPACE_VERSIONS = "DELETE FROM memory_versions WHERE ns = ?"
DELETE_COLLECTION_DOCUMENTS = "DELETE FROM documents WHERE ns = ? AND collection = ?"

FORGET_SESSIONS = "DELETE FROM sessions WHERE tenant = ? AND owner = ?"
FORGET_DOCUMENTS = f"DELETE FROM documents WHERE {WHERE_PERSONAL}"
FORGET_VERSIONS = f"DELETE FROM memory_versions WHERE {WHERE_PERSONAL}"
MERGE_TEXT_INDEX = "INSERT INTO memory_fts(memory_fts) VALUES ('optimize')"
