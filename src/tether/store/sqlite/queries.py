"""The SQLite store's statements for sessions, turns, leases, events and keys, by name.

Placeholders are positional (``?``); ``KEY_WHERE`` stands for three of them, tenant, owner and
session_id in that order, wherever it appears in a statement (first in most; after the values
being set in the lease and update statements). Memory statements are in :mod:`.recall_queries`.
"""

from __future__ import annotations

from tether.store.rows import API_KEY_COLS, DECISION_COLS, JOINED_DECISION_COLS

SESSION_COLS = (
    "tenant, owner, session_id, agent, metadata, state, created_at, updated_at, expires_at,"
    " revision"
)
TURN_COLS = (
    "t.id, s.tenant, s.owner, s.session_id, t.seq, t.input, t.policy, t.status, t.reason,"
    " t.error, t.output, t.complete, t.usage, t.created_at, t.started_at, t.ended_at,"
    " t.agent, t.agent_fingerprint, t.ran_by"
)
ITEM_COLS = (
    "seq, turn_id, kind, content, complete, call_id, tool_name, arguments, meta, created_at,"
    " excluded"
)
KEY_WHERE = "tenant = ? AND owner = ? AND session_id = ?"
TURNS_FROM = "FROM turns t JOIN sessions s ON s.pk = t.session_pk"

# -- sessions --------------------------------------------------------------------------------------
SESSION_PK = f"SELECT pk FROM sessions WHERE {KEY_WHERE}"
SESSION_FOR_ENQUEUE = f"SELECT pk, expires_at FROM sessions WHERE {KEY_WHERE}"
# Turns not ended. Statements that mean them spell ACTIVE exactly, since SQLite uses the
# partial index turns_active only when a query's WHERE holds its very term.
ACTIVE = "status IN ('queued', 'running', 'awaiting_input')"
# What a turn on an idle session needs of it to be admitted, leased and started in one pass
# (turns._start_at_once), and whether a turn of it is active (ACTIVE spelled as the partial
# index turns_active wants it).
SESSION_FOR_START = (
    "SELECT s.pk, s.expires_at, s.lease_owner, s.lease_expires_at, s.agent,"
    f" EXISTS (SELECT 1 FROM turns WHERE session_pk = s.pk AND {ACTIVE})"
    " FROM sessions s WHERE s.tenant = ? AND s.owner = ? AND s.session_id = ?"
)
# The owner's turns under way: sessions with one, and those turns in all. A parked turn holds
# no worker, so it counts for neither (rules.admit_for_principal). Read from the owner's own
# entries of the partial index turns_owner_busy (migration 9), not from every owner's active
# turns, nor every session of the owner; grouped in the index's own order (a COUNT(DISTINCT)
# sorts them again).
OWNER_ACTIVE = (
    "SELECT COUNT(*), COALESCE(SUM(n), 0) FROM (SELECT COUNT(*) AS n"
    " FROM turns INDEXED BY turns_owner_busy"
    " WHERE tenant = ? AND owner = ? AND status IN ('queued', 'running') GROUP BY session_pk)"
)
OWNER_SESSIONS = "SELECT COUNT(*) FROM sessions WHERE tenant = ? AND owner = ?"
FENCE = f"SELECT pk, lease_token, expires_at FROM sessions WHERE {KEY_WHERE}"
SESSION_AGENT = f"SELECT agent FROM sessions WHERE {KEY_WHERE}"
INSERT_SESSION = (
    "INSERT INTO sessions (tenant, owner, session_id, agent, metadata, created_at,"
    " updated_at, expires_at, lease_token, idle_ttl) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (tenant, owner, session_id) DO NOTHING"
)
GET_SESSION = f"SELECT {SESSION_COLS} FROM sessions WHERE {KEY_WHERE}"
LIST_SESSIONS = (
    f"SELECT {SESSION_COLS} FROM sessions WHERE tenant = ? AND owner = ?"
    " AND session_id > ? AND (? IS NULL OR instr(session_id, ?) > 0)"
    " ORDER BY session_id LIMIT ?"
)
# The most recently active first; the cursor is the last row's (updated_at, session_id).
LIST_SESSIONS_NEWEST = (
    f"SELECT {SESSION_COLS} FROM sessions WHERE tenant = ? AND owner = ?"
    " AND (? IS NULL OR updated_at < ? OR (updated_at = ? AND session_id > ?))"
    " AND (? IS NULL OR instr(session_id, ?) > 0)"
    " ORDER BY updated_at DESC, session_id LIMIT ?"
)
# A TTL given here is the session's own from now on: it no longer counts from the latest
# activity (idle_ttl NULL, so the idle-TTL trigger, migrations 11 and 12, leaves it as set).
UPDATE_SESSION = (
    "UPDATE sessions SET metadata = ?, state = ?, expires_at = ?, updated_at = ?,"
    " idle_ttl = CASE WHEN ? THEN NULL ELSE idle_ttl END,"
    f" revision = revision + 1 WHERE {KEY_WHERE}"
)
DELETE_SESSION = f"DELETE FROM sessions WHERE {KEY_WHERE} RETURNING pk"
COUNT_ITEMS = "SELECT COUNT(*) FROM items WHERE session_pk = ?"
COUNT_TURNS = (
    f"SELECT COUNT(*), COALESCE(SUM({ACTIVE}), 0), COALESCE(SUM(status = 'awaiting_input'), 0)"
    " FROM turns WHERE session_pk = ?"
)
# The agents of a session's turns (sent to, and handed to), by their first turn (in one turn,
# the agent it was sent to first).
TURN_AGENTS = (
    "SELECT name FROM ("
    "  SELECT agent AS name, MIN(seq) * 2 AS first FROM turns"
    "  WHERE session_pk = ? AND agent IS NOT NULL GROUP BY agent"
    "  UNION ALL SELECT ran_by, MIN(seq) * 2 + 1 FROM turns"
    "  WHERE session_pk = ? AND ran_by IS NOT NULL GROUP BY ran_by"
    ") GROUP BY name ORDER BY MIN(first), name"
)
# Idle and expired: no active turn (a parked one included) and no unexpired lease
# (rules.is_expired and rules.sweepable), so a sweep never pulls a session from under a turn.
# The expired ones are found by the index of expiring sessions (migration 10).
SWEEP_EXPIRED = (
    "DELETE FROM sessions WHERE pk IN (SELECT s.pk FROM sessions s"
    " WHERE s.expires_at IS NOT NULL AND s.expires_at <= ?"
    " AND (s.lease_owner IS NULL OR s.lease_expires_at <= ?)"
    " AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_pk = s.pk"
    f"  AND t.{ACTIVE}) LIMIT ?)"
    " RETURNING tenant, owner, session_id"
)
# A session with a parked turn has nothing to run until the decision is made.
# From the active turns (tens), never from the sessions (SQLite's planner, without statistics,
# walked all of them: 150 ms at 100,000 sessions, every 15 s, on the store's one thread).
SESSIONS_NEEDING_WORK = (
    "SELECT DISTINCT s.tenant, s.owner, s.session_id FROM turns t INDEXED BY turns_active"
    f" CROSS JOIN sessions s ON s.pk = t.session_pk WHERE t.{ACTIVE}"
    " AND NOT EXISTS (SELECT 1 FROM turns p WHERE p.session_pk = t.session_pk"
    "  AND p.status = 'awaiting_input')"
    " AND (? IS NULL OR s.lease_owner IS NULL OR s.lease_expires_at <= ?)"
)

# -- items -----------------------------------------------------------------------------------------
LIST_ITEMS = f"SELECT {ITEM_COLS} FROM items WHERE session_pk = ? AND seq > ? ORDER BY seq LIMIT ?"
SKIP_ITEM_SEQS = "UPDATE sessions SET next_item_seq = next_item_seq + ? WHERE pk = ?"
RECENT_ITEMS = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = ? AND seq < ?"
    " AND excluded = 0 ORDER BY seq DESC LIMIT ?"
)
LATEST_SUMMARY = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = ? AND kind = 'summary'"
    " AND excluded = 0 ORDER BY seq DESC LIMIT 1"
)
LATEST_HANDOFF = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = ? AND kind = 'handoff'"
    " AND excluded = 0 ORDER BY seq DESC LIMIT 1"
)
CLEAR_ITEMS = "DELETE FROM items WHERE session_pk = ?"
# Clearing is refused while a turn is active, so these are all of its turns (their events and
# decisions cascade).
CLEAR_TURNS = f"DELETE FROM turns WHERE session_pk = ? AND NOT {ACTIVE}"
NEXT_ITEM_SEQS = (
    "UPDATE sessions SET next_item_seq = next_item_seq + ?, updated_at = ?"
    " WHERE pk = ? RETURNING next_item_seq - ?"
)
INSERT_ITEM = (
    "INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id,"
    " tool_name, arguments, meta, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
DELETE_TURN_ITEMS = "DELETE FROM items WHERE session_pk = ? AND turn_id = ?"
EXCLUDE_TURN_ITEMS = "UPDATE items SET excluded = 1 WHERE session_pk = ? AND turn_id = ?"
ORPHAN_CALLS = (
    "SELECT call_id, tool_name FROM items c WHERE c.session_pk = ?"
    " AND c.turn_id = ? AND c.kind = 'tool_call' AND NOT EXISTS ("
    "  SELECT 1 FROM items r WHERE r.session_pk = c.session_pk"
    "  AND r.turn_id = c.turn_id AND r.kind = 'tool_result'"
    "  AND r.call_id = c.call_id) ORDER BY c.seq"
)

# -- turns -----------------------------------------------------------------------------------------
FIRST_ACTIVE_TURN = f"SELECT id FROM turns WHERE session_pk = ? AND {ACTIVE} ORDER BY seq LIMIT 1"
ACTIVE_TURN_IDS = f"SELECT id, status FROM turns WHERE session_pk = ? AND {ACTIVE} ORDER BY seq"
NEXT_TURN_SEQ = (
    "UPDATE sessions SET next_turn_seq = next_turn_seq + 1 WHERE pk = ? RETURNING next_turn_seq - 1"
)
INSERT_TURN = (
    "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at, agent,"
    " agent_fingerprint, idempotency_key, request_digest, tenant, owner)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
GET_TURN = f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.id = ? AND t.session_pk = ?"
TURN_BY_IDEMPOTENCY = (
    f"SELECT {TURN_COLS}, t.request_digest {TURNS_FROM}"
    " WHERE t.session_pk = ? AND t.idempotency_key = ?"
)
RELEASE_IDEMPOTENCY = (
    "UPDATE turns SET idempotency_key = NULL WHERE session_pk = ? AND idempotency_key = ?"
)
LIST_TURNS = (
    f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.session_pk = ? AND t.seq > ? ORDER BY t.seq LIMIT ?"
)
ACTIVE_TURNS = (
    f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.session_pk = ? AND t.{ACTIVE} ORDER BY t.seq"
)
# A turn nobody runs, to end it: with the memory it holds.
WAITING_TURN = (
    f"SELECT {TURN_COLS}, t.held_memory {TURNS_FROM}"
    " WHERE t.id = ? AND t.session_pk = ? AND t.status IN ('queued', 'awaiting_input')"
)
RUNNING_TURNS = (
    f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.session_pk = ? AND t.status = 'running'"
    " ORDER BY t.seq"
)
ANY_RUNNING = "SELECT 1 FROM turns WHERE session_pk = ? AND status = 'running' LIMIT 1"
# The admission's seq, the lease and the items' seqs of a turn started at once: what
# NEXT_TURN_SEQ, ACQUIRE_LEASE and NEXT_ITEM_SEQS return, in one update.
START_AT_ONCE = (
    "UPDATE sessions SET next_turn_seq = next_turn_seq + 1, lease_owner = ?,"
    " lease_token = lease_token + 1, lease_expires_at = ?, next_item_seq = next_item_seq + ?,"
    " updated_at = ? WHERE pk = ? RETURNING next_turn_seq - 1, lease_token, next_item_seq - ?"
)
INSERT_STARTED_TURN = (
    "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at, started_at,"
    " agent, agent_fingerprint, idempotency_key, request_digest, tenant, owner)"
    " VALUES (?,?,?,?,?,'running',?,?,?,?,NULL,NULL,?,?)"
)
START_TURN = (
    "UPDATE turns SET status = 'running', started_at = ?"
    " WHERE id = ? AND session_pk = ? AND status = 'queued' AND started_at IS NULL"
)
# Why a start was refused (asked only then): the turn is not a new queued one, or it is and an
# earlier turn of the session is still active.
TURN_IS_NEW = (
    "SELECT 1 FROM turns WHERE id = ? AND session_pk = ? AND status = 'queued'"
    " AND started_at IS NULL"
)
TURN_IS_RUNNING = "SELECT 1 FROM turns WHERE id = ? AND session_pk = ? AND status = 'running'"
# An ended turn holds no memory writes any more: they were applied or dropped.
FINISH_TURN = (
    "UPDATE turns SET status = ?, reason = ?, error = ?, output = ?, complete = ?,"
    " usage = ?, ended_at = ?, ran_by = ?, held_memory = NULL WHERE id = ?"
)
PARK_TURN = (
    "UPDATE turns SET status = 'awaiting_input', usage = ?, held_memory = ?"
    " WHERE id = ? AND status = 'running'"
)
RESUMABLE = "SELECT status, started_at, held_memory FROM turns WHERE id = ? AND session_pk = ?"
RESUME_TURN = "UPDATE turns SET status = 'running', held_memory = NULL WHERE id = ?"
REQUEUE_TURN = "UPDATE turns SET status = 'queued' WHERE id = ? AND status = 'awaiting_input'"
TURN_ITEMS = f"SELECT {ITEM_COLS} FROM items WHERE session_pk = ? AND turn_id = ? ORDER BY seq"
REQUEST_CANCEL = (
    "UPDATE turns SET cancel_request = ? WHERE id = ? AND session_pk = ?"
    " AND status = 'running' AND cancel_request IS NULL"
)
CANCEL_REQUESTS = (
    "SELECT id, cancel_request FROM turns WHERE id IN (SELECT value FROM json_each(?))"
    " AND cancel_request IS NOT NULL"
)

# -- leases ----------------------------------------------------------------------------------------
# Of racing acquirers, the first to update the row wins: BEGIN IMMEDIATE serializes them.
ACQUIRE_LEASE = (
    "UPDATE sessions SET lease_owner = ?, lease_token = lease_token + 1, lease_expires_at = ?"
    f" WHERE {KEY_WHERE} AND (lease_owner IS NULL OR lease_expires_at <= ?)"
    " RETURNING lease_token, pk, next_item_seq"
)
TAKE_OVER_LEASE = (
    "UPDATE sessions SET lease_owner = ?, lease_token = lease_token + 1, lease_expires_at = ?"
    f" WHERE {KEY_WHERE} AND lease_owner = ? RETURNING lease_token"
)
LEASE_HOLDER = f"SELECT lease_owner, lease_expires_at FROM sessions WHERE {KEY_WHERE}"
RENEW_LEASE = (
    f"UPDATE sessions SET lease_expires_at = ? WHERE {KEY_WHERE}"
    " AND lease_token = ? AND lease_owner = ?"
)
# A running turn's ending, its lease given up with it (turns._end_released): the fence, the
# turn and its last event seq in one read, whether another turn keeps the lease, the items
# numbered and the lease let go ($3, $4: 1 to let it go) in one update.
FENCE_AND_TURN = (
    f"SELECT s.pk, s.lease_token, {TURN_COLS},"
    " (SELECT COALESCE(MAX(COALESCE(e.last_seq, e.seq)), 0) FROM events e"
    "  WHERE e.turn_id = t.id)"
    " FROM sessions s LEFT JOIN turns t ON t.session_pk = s.pk AND t.id = ?"
    " WHERE s.tenant = ? AND s.owner = ? AND s.session_id = ?"
)
OTHER_ACTIVE_TURN = f"SELECT 1 FROM turns WHERE session_pk = ? AND {ACTIVE} AND id <> ? LIMIT 1"
NUMBER_ITEMS_RELEASING = (
    "UPDATE sessions SET next_item_seq = next_item_seq + ?, updated_at = ?,"
    " lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END,"
    " lease_expires_at = CASE WHEN ? THEN 0 ELSE lease_expires_at END"
    " WHERE pk = ? RETURNING next_item_seq - ?"
)
RELEASE_LEASE = (
    "UPDATE sessions SET lease_owner = NULL, lease_expires_at = 0"
    f" WHERE {KEY_WHERE} AND lease_token = ?"
)

# -- events ----------------------------------------------------------------------------------------
LAST_EVENT_SEQ = "SELECT COALESCE(MAX(COALESCE(last_seq, seq)), 0) FROM events WHERE turn_id = ?"
INSERT_EVENT = (
    "INSERT INTO events (turn_id, seq, last_seq, type, data, created_at) VALUES (?,?,?,?,?,?)"
)
LIST_EVENTS = (
    "SELECT e.seq, e.last_seq, e.type, e.data, e.created_at FROM events e"
    " JOIN turns t ON t.id = e.turn_id WHERE e.turn_id = ? AND t.session_pk = ?"
    " AND COALESCE(e.last_seq, e.seq) > ? ORDER BY e.seq LIMIT ?"
)

# -- API keys --------------------------------------------------------------------------------------
INSERT_API_KEY = (
    "INSERT INTO api_keys (id, tenant, user_id, roles, hash, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
API_KEY_BY_HASH = f"SELECT {API_KEY_COLS} FROM api_keys WHERE hash = ?"
LIST_API_KEYS = f"SELECT {API_KEY_COLS} FROM api_keys ORDER BY created_at"
REVOKE_API_KEY = "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL"
COUNT_API_KEYS = "SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL"

# -- decisions -------------------------------------------------------------------------------------
INSERT_DECISION = (
    f"INSERT INTO decisions (session_pk, {DECISION_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
GET_DECISION = (
    f"SELECT {DECISION_COLS} FROM decisions WHERE session_pk = ? AND turn_id = ? AND call_id = ?"
)
LIST_DECISIONS = (
    f"SELECT {DECISION_COLS} FROM decisions WHERE session_pk = ?"
    " AND (? IS NULL OR turn_id = ?) AND (? IS NULL OR status = ?)"
    " ORDER BY created_at, turn_id, call_id LIMIT ?"
)
PENDING_OF_TURN = (
    f"SELECT {DECISION_COLS} FROM decisions WHERE turn_id = ? AND status = 'pending'"
    " ORDER BY created_at, call_id"
)
# Conditional on still being pending: a decision ends once.
CLOSE_DECISION = (
    "UPDATE decisions SET status = ?, answer = ?, decided_by = ?, decided_at = ?"
    " WHERE turn_id = ? AND call_id = ? AND status = 'pending'"
)
DUE_DECISIONS = (
    f"SELECT s.tenant, s.owner, s.session_id, {JOINED_DECISION_COLS}"
    " FROM decisions d JOIN sessions s ON s.pk = d.session_pk"
    " WHERE d.status = 'pending' AND d.deadline <= ? ORDER BY d.deadline LIMIT ?"
)
NEXT_DECISION_DEADLINE = "SELECT MIN(deadline) FROM decisions WHERE status = 'pending'"
SESSION_STATE = "SELECT state FROM sessions WHERE pk = ?"
SET_SESSION_STATE = (
    "UPDATE sessions SET state = ?, updated_at = ?, revision = revision + 1 WHERE pk = ?"
)
