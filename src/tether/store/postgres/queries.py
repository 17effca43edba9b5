"""The PostgreSQL store's statements for sessions, turns, leases, events and keys, by name.

Where ``KEY_WHERE`` appears, ``$1, $2, $3`` are tenant, owner, session_id. Memory statements are
in :mod:`.recall_queries`.
"""

from __future__ import annotations

from tether.store.rows import API_KEY_COLS, DECISION_COLS, JOINED_DECISION_COLS

# $1, $2, $3 are always tenant, owner, session_id where KEY_WHERE appears.
KEY_WHERE = "tenant = $1 AND owner = $2 AND session_id = $3"
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
TURNS_FROM = "FROM turns t JOIN sessions s ON s.pk = t.session_pk"
# Turns not ended: a parked one (awaiting_input) holds its session's place in order.
ACTIVE = "status IN ('queued', 'running', 'awaiting_input')"

SESSION_PK = f"SELECT pk FROM sessions WHERE {KEY_WHERE}"
# Every transaction that writes a session's turns, items or events takes its row lock first;
# acquiring or taking over the lease updates the same row, so it waits for that transaction
# (or the transaction waits for it, and then reads the new token).
LOCK_SESSION = f"SELECT pk, lease_token, expires_at FROM sessions WHERE {KEY_WHERE} FOR UPDATE"
SESSION_AGENT = "SELECT agent FROM sessions WHERE pk = $1"

INSERT_SESSION = (
    "INSERT INTO sessions (tenant, owner, session_id, agent, metadata, created_at, updated_at,"
    " expires_at, lease_token, idle_ttl) VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8, $9)"
    f" ON CONFLICT (tenant, owner, session_id) DO NOTHING RETURNING {SESSION_COLS}"
)
GET_SESSION = f"SELECT {SESSION_COLS} FROM sessions WHERE {KEY_WHERE}"
LIST_SESSIONS = (
    f"SELECT {SESSION_COLS} FROM sessions WHERE tenant = $1 AND owner = $2"
    " AND ($4::text IS NULL OR strpos(session_id, $4) > 0)"
    " ORDER BY session_id LIMIT $3"
)
LIST_SESSIONS_AFTER = (
    f"SELECT {SESSION_COLS} FROM sessions WHERE tenant = $1 AND owner = $2 AND session_id > $4"
    " AND ($5::text IS NULL OR strpos(session_id, $5) > 0)"
    " ORDER BY session_id LIMIT $3"
)
# The most recently active first; the cursor is the last row's (updated_at, session_id).
LIST_SESSIONS_NEWEST = (
    f"SELECT {SESSION_COLS} FROM sessions WHERE tenant = $1 AND owner = $2"
    " AND ($4::double precision IS NULL OR updated_at < $4"
    "      OR (updated_at = $4 AND session_id > $5::text))"
    " AND ($6::text IS NULL OR strpos(session_id, $6) > 0)"
    " ORDER BY updated_at DESC, session_id LIMIT $3"
)
# A TTL given here is the session's own from now on: it no longer counts from the latest
# activity (idle_ttl NULL, so the idle-TTL trigger, migrations 21 and 22, leaves it as set).
UPDATE_SESSION = (
    "UPDATE sessions SET metadata = COALESCE($4, metadata), state = COALESCE($5, state),"
    " expires_at = COALESCE($6, expires_at), updated_at = $7, revision = revision + 1,"
    " idle_ttl = CASE WHEN $6 IS NULL THEN idle_ttl END"
    f" WHERE {KEY_WHERE} AND ($8::bigint IS NULL OR revision = $8) RETURNING {SESSION_COLS}"
)
SESSION_REVISION = f"SELECT revision FROM sessions WHERE {KEY_WHERE}"
DELETE_SESSION = f"DELETE FROM sessions WHERE {KEY_WHERE} RETURNING pk"
SESSION_STATS = (
    "SELECT (SELECT count(*) FROM items i WHERE i.session_pk = s.pk),"
    " (SELECT count(*) FROM turns t WHERE t.session_pk = s.pk),"
    f" (SELECT count(*) FROM turns t WHERE t.session_pk = s.pk AND t.{ACTIVE}),"
    " (SELECT count(*) FROM turns t WHERE t.session_pk = s.pk AND t.status = 'awaiting_input'),"
    # The agents of its turns (sent to, and handed to), by their first turn.
    " (SELECT array_agg(name ORDER BY first, name) FROM ("
    "   SELECT name, min(first) AS first FROM ("
    "     SELECT t.agent AS name, min(t.seq) * 2 AS first FROM turns t"
    "     WHERE t.session_pk = s.pk AND t.agent IS NOT NULL GROUP BY t.agent"
    "     UNION ALL SELECT t.ran_by, min(t.seq) * 2 + 1 FROM turns t"
    "     WHERE t.session_pk = s.pk AND t.ran_by IS NOT NULL GROUP BY t.ran_by"
    "   ) named GROUP BY name) firsts)"
    f" FROM sessions s WHERE {KEY_WHERE}"
)

LIST_ITEMS = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = $1 AND seq > $2 ORDER BY seq LIMIT $3"
)
LATEST_SUMMARY = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = $1 AND kind = 'summary' AND NOT excluded"
    " ORDER BY seq DESC LIMIT 1"
)
LATEST_HANDOFF = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = $1 AND kind = 'handoff' AND NOT excluded"
    " ORDER BY seq DESC LIMIT 1"
)
# The session found by its key in the same statement: no round trip for its pk first (none
# found, an empty answer; the caller tells a missing session apart then).
RECENT_ITEMS = (
    f"SELECT {ITEM_COLS} FROM items WHERE session_pk = (SELECT pk FROM sessions WHERE"
    f" {KEY_WHERE}) AND seq < $4 AND NOT excluded ORDER BY seq DESC LIMIT $5"
)
CLEAR_ITEMS = "DELETE FROM items WHERE session_pk = $1"
# Clearing is refused while a turn is active, so these are all of its turns (their events and
# decisions cascade).
CLEAR_TURNS = f"DELETE FROM turns WHERE session_pk = $1 AND NOT {ACTIVE}"
NEXT_ITEM_SEQS = (
    "UPDATE sessions SET next_item_seq = next_item_seq + $2, updated_at = $3 WHERE pk = $1"
    " RETURNING next_item_seq - $2"
)
INSERT_ITEMS = (
    "INSERT INTO items (session_pk, seq, turn_id, kind, content, complete, call_id, tool_name,"
    " arguments, meta, created_at)"
    " SELECT $1, u.seq, $2, u.kind, u.content, u.complete, u.call_id, u.tool_name, u.arguments,"
    " u.meta, $3 FROM unnest($4::bigint[], $5::text[], $6::text[], $7::boolean[], $8::text[],"
    " $9::text[], $10::text[], $11::text[])"
    " AS u(seq, kind, content, complete, call_id, tool_name, arguments, meta)"
)
DELETE_TURN_ITEMS = "DELETE FROM items WHERE session_pk = $1 AND turn_id = $2"
SKIP_ITEM_SEQS = "UPDATE sessions SET next_item_seq = next_item_seq + $2 WHERE pk = $1"
EXCLUDE_TURN_ITEMS = "UPDATE items SET excluded = true WHERE session_pk = $1 AND turn_id = $2"
ORPHAN_CALLS = (
    "SELECT call_id, tool_name FROM items c WHERE c.session_pk = $1 AND c.turn_id = $2"
    " AND c.kind = 'tool_call' AND NOT EXISTS ("
    "  SELECT 1 FROM items r WHERE r.session_pk = c.session_pk AND r.turn_id = c.turn_id"
    "  AND r.kind = 'tool_result' AND r.call_id = c.call_id) ORDER BY c.seq"
)

FIRST_ACTIVE_TURN = f"SELECT id FROM turns WHERE session_pk = $1 AND {ACTIVE} ORDER BY seq LIMIT 1"
# The owner's turns under way, counted under the owner's advisory lock, in one round trip
# (the function is migration 13's, over busy_sessions). A parked turn holds no worker, so it is
# not counted (rules.admit_for_principal).
LOCK_OWNER_ACTIVE = "SELECT busy, active FROM tether_owner_active($1, $2)"
# A running turn's fenced write in one round trip, committed as it returns (migration 10).
WRITE = (
    "SELECT outcome, current_token, first_seq, last_event FROM tether_write($1, $2, $3, $4, $5,"
    " $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
)
# A running turn's ending in one round trip, committed as it returns (migration 11).
END = (
    "SELECT outcome, current_token, first_seq, last_event, turn_seq, turn_input, turn_policy,"
    " turn_created, turn_started, turn_agent, turn_fingerprint FROM tether_end($1, $2, $3, $4,"
    " $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22,"
    " $23, $24, $25)"
)
# The same, and the lease given up when no other turn of the session is active (migration 23).
END_RELEASE = (
    "SELECT outcome, current_token, first_seq, last_event, turn_seq, turn_input, turn_policy,"
    " turn_created, turn_started, turn_agent, turn_fingerprint, released FROM"
    " tether_end_release($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,"
    " $17, $18, $19, $20, $21, $22, $23, $24, $25)"
)
# A whole admission in one round trip, committed as it returns (migration 14's overload).
ENQUEUE = (
    "SELECT outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total"
    " FROM tether_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,"
    " $16, $17, $18)"
)
# The same, and the session's lease taken for $18 when it is free (migration 17's overload;
# $19: when the lease is to run out, NULL not to take it).
ENQUEUE_LEASED = (
    "SELECT outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total, r_token,"
    " r_next_item FROM tether_enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,"
    " $14, $15, $16, $17, $18, $19)"
)
# A turn admitted under the caller's lease ($19: its token) and started at once when nothing
# is ahead of it, with tether_write's items and events ($20-$30) (migration 18).
ENQUEUE_STARTED = (
    "SELECT outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total,"
    " current_token, first_seq FROM tether_enqueue_started($1, $2, $3, $4, $5, $6, $7, $8, $9,"
    " $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27,"
    " $28, $29, $30)"
)
# ENQUEUE_LEASED, and the turn started under the lease taken ($19) when nothing is ahead of it,
# with tether_write's items and events ($20-$30); $31: the agent the session is expected to
# name (migration 19).
ENQUEUE_TAKEN = (
    "SELECT outcome, turn_seq, expires_at, active_ids, active_statuses, busy, total, r_token,"
    " r_next_item, first_seq, found_agent FROM tether_enqueue_taken($1, $2, $3, $4, $5, $6, $7,"
    " $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25,"
    " $26, $27, $28, $29, $30, $31)"
)
# A turn queued on a session another process holds: announced to it on commit (migration 14).
# The payload is the key joined by chr(31); one that cannot be told apart (a part holding
# chr(31)) or would pass NOTIFY's 8,000 bytes is sent empty: "look at every session you hold".
QUEUED_CHANNEL = "tether_queued"
_QUEUED_PAYLOAD = (
    "CASE WHEN position(chr(31) IN s.tenant || s.owner || s.session_id) = 0"
    " AND octet_length(s.tenant || s.owner || s.session_id) < 7900"
    " THEN s.tenant || chr(31) || s.owner || chr(31) || s.session_id ELSE '' END"
)
# Sent to whoever holds the session but $6 (the submitter's own lease owner; NULL when the
# caller cannot tell, as for a decided turn queued again or a waiting turn ended, after which
# the turn behind it may run: a kick given twice does no harm, and these are few).
NOTIFY_HOLDER = (
    f"SELECT pg_notify($1, {_QUEUED_PAYLOAD}) FROM sessions s"
    " WHERE s.tenant = $2 AND s.owner = $3 AND s.session_id = $4"
    " AND s.lease_owner IS NOT NULL AND s.lease_expires_at > $5"
    " AND s.lease_owner IS DISTINCT FROM $6"
)
# A session made under its owner's bound, in one round trip (migration 15).
CREATE_SESSION = (
    "SELECT outcome, sessions_held, r_tenant, r_owner, r_session, r_agent, r_metadata,"
    " r_state, r_created, r_updated, r_expires, r_revision"
    " FROM tether_create_session($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
)
ACTIVE_TURN_IDS = f"SELECT id, status FROM turns WHERE session_pk = $1 AND {ACTIVE} ORDER BY seq"
NEXT_TURN_SEQ = (
    "UPDATE sessions SET next_turn_seq = next_turn_seq + 1 WHERE pk = $1"
    " RETURNING next_turn_seq - 1"
)
INSERT_TURN = (
    "INSERT INTO turns (id, session_pk, seq, input, policy, status, created_at, agent,"
    " agent_fingerprint, idempotency_key, request_digest)"
    " VALUES ($1, $2, $3, $4, $5, 'queued', $6, $7, $8, $9, $10)"
    " ON CONFLICT (id) DO NOTHING RETURNING id"
)
GET_TURN = f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.id = $2 AND t.session_pk = $1"
TURN_BY_IDEMPOTENCY = (
    f"SELECT {TURN_COLS}, t.request_digest {TURNS_FROM}"
    " WHERE t.session_pk = $1 AND t.idempotency_key = $2"
)
RELEASE_IDEMPOTENCY = (
    "UPDATE turns SET idempotency_key = NULL WHERE session_pk = $1 AND idempotency_key = $2"
)
GET_TURN_BY_KEY = (
    f"SELECT {TURN_COLS} {TURNS_FROM}"
    " WHERE s.tenant = $1 AND s.owner = $2 AND s.session_id = $3 AND t.id = $4"
)
LIST_TURNS = (
    f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.session_pk = $1 AND t.seq > $2"
    " ORDER BY t.seq LIMIT $3"
)
# A session's active turns by its key, in one round trip: no row when there is no such
# session, one row whose turn columns are all NULL when it has none (a worker asks after
# every turn, so this is on every turn's path).
ACTIVE_TURNS_BY_KEY = (
    f"SELECT {TURN_COLS} FROM sessions s LEFT JOIN turns t"
    f" ON t.session_pk = s.pk AND t.{ACTIVE}"
    " WHERE s.tenant = $1 AND s.owner = $2 AND s.session_id = $3 ORDER BY t.seq"
)
# A turn nobody runs, to end it: with the memory it holds.
WAITING_TURN = (
    f"SELECT {TURN_COLS}, t.held_memory {TURNS_FROM}"
    " WHERE t.id = $2 AND t.session_pk = $1 AND t.status IN ('queued', 'awaiting_input')"
)
# Recovery's common case in one read: the lease's token, and whether any turn is running.
RUNNING_UNDER_LEASE = (
    "SELECT s.lease_token, EXISTS (SELECT 1 FROM turns t WHERE t.session_pk = s.pk"
    f" AND t.status = 'running') FROM sessions s WHERE {KEY_WHERE}"
)
RUNNING_TURNS = (
    f"SELECT {TURN_COLS} {TURNS_FROM} WHERE t.session_pk = $1 AND t.status = 'running'"
    " ORDER BY t.seq"
)
# An ended turn holds no memory writes any more: they were applied or dropped.
FINISH_TURN = (
    "UPDATE turns SET status = $2, reason = $3, error = $4, output = $5, complete = $6,"
    " usage = $7, ended_at = $8, ran_by = $9, held_memory = NULL WHERE id = $1"
)
PARK_TURN = (
    "UPDATE turns t SET status = 'awaiting_input', usage = $3, held_memory = $4"
    " FROM sessions s WHERE s.pk = t.session_pk"
    f" AND t.id = $2 AND t.session_pk = $1 AND t.status = 'running' RETURNING {TURN_COLS}"
)
# Conditional on the turn being decided and waiting to go on; o is the row as it was, so the
# memory it held comes back while the row lets go of it.
RESUME_TURN = (
    "UPDATE turns t SET status = 'running', held_memory = NULL FROM turns o"
    " WHERE o.id = t.id AND t.id = $2 AND t.session_pk = $1 AND t.status = 'queued'"
    " AND t.started_at IS NOT NULL RETURNING o.held_memory"
)
REQUEUE_TURN = "UPDATE turns SET status = 'queued' WHERE id = $1 AND status = 'awaiting_input'"
TURN_ITEMS = f"SELECT {ITEM_COLS} FROM items WHERE session_pk = $1 AND turn_id = $2 ORDER BY seq"
# A session with a parked turn has nothing to run until the decision is made.
# From busy_sessions (the sessions with queued or running turns, migration 13), each session
# looked up by its key: the LIMIT keeps the planner from joining all sessions by hash instead
# (a scan of every session, 46 ms at 100,000, every 15 s in every process).
SESSIONS_NEEDING_WORK = (
    "SELECT s.tenant, s.owner, s.session_id FROM busy_sessions b CROSS JOIN LATERAL ("
    " SELECT s.tenant, s.owner, s.session_id FROM sessions s WHERE s.pk = b.session_pk"
    " AND ($1::double precision IS NULL OR s.lease_owner IS NULL"
    " OR s.lease_expires_at <= $1::double precision) LIMIT 1) s"
    " WHERE NOT EXISTS (SELECT 1 FROM turns p WHERE p.session_pk = b.session_pk"
    "  AND p.status = 'awaiting_input')"
    " ORDER BY b.session_pk"
)

# The lease and what its holder needs to know of the session, in one round trip (migration
# 16): no row while it is held.
ACQUIRE = "SELECT token, next_item, running, queue FROM tether_acquire($1, $2, $3, $4, $5, $6)"
TAKE_OVER_LEASE = (
    "UPDATE sessions SET lease_owner = $4, lease_token = lease_token + 1, lease_expires_at = $5"
    f" WHERE {KEY_WHERE} AND lease_owner = $6 RETURNING lease_token"
)
LEASE_HOLDER = f"SELECT lease_owner, lease_expires_at FROM sessions WHERE {KEY_WHERE}"
# One statement for any number of leases. The rows are locked in pk order, as every process
# renews: two renewals over overlapping sessions then cannot deadlock.
RENEW_LEASES = (
    "WITH wanted AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[],"
    " $6::text[]) AS w(tenant, owner, session_id, token, lease_owner)),"
    " locked AS (SELECT s.pk FROM sessions s JOIN wanted w ON s.tenant = w.tenant"
    "  AND s.owner = w.owner AND s.session_id = w.session_id AND s.lease_token = w.token"
    "  AND s.lease_owner = w.lease_owner ORDER BY s.pk FOR UPDATE OF s)"
    " UPDATE sessions SET lease_expires_at = $1 WHERE pk IN (SELECT pk FROM locked)"
    " RETURNING tenant, owner, session_id, lease_token"
)
RELEASE_LEASE = (
    "UPDATE sessions SET lease_owner = NULL, lease_expires_at = 0"
    f" WHERE {KEY_WHERE} AND lease_token = $4"
)

LAST_EVENT_SEQ = "SELECT COALESCE(MAX(COALESCE(last_seq, seq)), 0) FROM events WHERE turn_id = $1"
INSERT_EVENTS = (
    "INSERT INTO events (turn_id, seq, last_seq, type, data, created_at)"
    " SELECT $1, u.seq, u.last_seq, u.type, u.data, $2"
    " FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::text[])"
    " AS u(seq, last_seq, type, data)"
)
INSERT_EVENT = (
    "INSERT INTO events (turn_id, seq, type, data, created_at) VALUES ($1, $2, $3, $4, $5)"
)
LIST_EVENTS = (
    "SELECT e.seq, e.last_seq, e.type, e.data, e.created_at FROM events e"
    " JOIN turns t ON t.id = e.turn_id JOIN sessions s ON s.pk = t.session_pk"
    " WHERE s.tenant = $1 AND s.owner = $2 AND s.session_id = $3 AND e.turn_id = $4"
    " AND COALESCE(e.last_seq, e.seq) > $5 ORDER BY e.seq LIMIT $6"
)

INSERT_API_KEY = (
    "INSERT INTO api_keys (id, tenant, user_id, roles, hash, created_at)"
    " VALUES ($1, $2, $3, $4, $5, $6)"
)
API_KEY_BY_HASH = f"SELECT {API_KEY_COLS} FROM api_keys WHERE hash = $1"
LIST_API_KEYS = f"SELECT {API_KEY_COLS} FROM api_keys ORDER BY created_at, id"
REVOKE_API_KEY = (
    "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL RETURNING id"
)
COUNT_API_KEYS = "SELECT count(*) FROM api_keys WHERE revoked_at IS NULL"

REQUEST_CANCEL = (
    f"UPDATE turns SET cancel_request = $5 WHERE id = $4"
    f" AND session_pk = (SELECT pk FROM sessions WHERE {KEY_WHERE})"
    " AND status = 'running' AND cancel_request IS NULL RETURNING id"
)
# The owner hears of a request at once through this channel (payload: the turn id); the request
# itself stays in the row, so a process that was not listening still finds it by polling.
CANCEL_CHANNEL = "tether_cancel"
NOTIFY_CANCEL = "SELECT pg_notify($1, $2)"
CANCEL_REQUESTS = (
    "SELECT id, cancel_request FROM turns WHERE id = ANY($1::text[]) AND cancel_request IS NOT NULL"
)
SWEEP_EXPIRED = (
    "DELETE FROM sessions WHERE pk IN (SELECT s.pk FROM sessions s"
    " WHERE s.expires_at IS NOT NULL AND s.expires_at <= $1"
    " AND (s.lease_owner IS NULL OR s.lease_expires_at <= $1)"
    " AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_pk = s.pk"
    f"  AND t.{ACTIVE}) LIMIT $2 FOR UPDATE SKIP LOCKED)"
    " RETURNING tenant, owner, session_id"
)

# -- decisions -------------------------------------------------------------------------------------
INSERT_DECISION = (
    f"INSERT INTO decisions (session_pk, {DECISION_COLS})"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    " ON CONFLICT (turn_id, call_id) DO NOTHING RETURNING call_id"
)
GET_DECISION = (
    f"SELECT {DECISION_COLS} FROM decisions WHERE session_pk = $1 AND turn_id = $2 AND call_id = $3"
)
LIST_DECISIONS = (
    f"SELECT {DECISION_COLS} FROM decisions WHERE session_pk = $1"
    " AND ($2::text IS NULL OR turn_id = $2) AND ($3::text IS NULL OR status = $3)"
    " ORDER BY created_at, turn_id, call_id LIMIT $4"
)
# A turn's pending decisions, ended (cancelled, decided by nobody) because the turn ends.
DROP_OF_TURN = (
    "UPDATE decisions SET status = 'cancelled', decided_by = NULL, decided_at = $2"
    f" WHERE turn_id = $1 AND status = 'pending' RETURNING {DECISION_COLS}"
)
# Conditional on still being pending: a decision ends once.
CLOSE_DECISION = (
    "UPDATE decisions SET status = $3, answer = $4, decided_by = $5, decided_at = $6"
    " WHERE turn_id = $1 AND call_id = $2 AND status = 'pending' RETURNING call_id"
)
# Due decisions with their sessions' rows locked, as every writer of a session's turns and
# events locks them first. SKIP LOCKED: a session another transaction holds (a sweep on another
# node, a decider, its owner) is left for the next sweep rather than waited for.
DUE_DECISIONS = (
    f"SELECT s.pk, s.tenant, s.owner, s.session_id, {JOINED_DECISION_COLS}"
    " FROM decisions d JOIN sessions s ON s.pk = d.session_pk"
    " WHERE d.status = 'pending' AND d.deadline <= $1 ORDER BY d.deadline LIMIT $2"
    " FOR UPDATE OF s SKIP LOCKED"
)
NEXT_DECISION_DEADLINE = "SELECT min(deadline) FROM decisions WHERE status = 'pending'"
# The session row for a decision, locked like a fenced write's (so deciders take turns).
LOCK_SESSION_STATE = f"SELECT pk, state FROM sessions WHERE {KEY_WHERE} FOR UPDATE"
SET_SESSION_STATE = (
    "UPDATE sessions SET state = $2, updated_at = $3, revision = revision + 1 WHERE pk = $1"
)
