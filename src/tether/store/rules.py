"""The rules every store backend keeps, written once and free of I/O (DESIGN §3, §4, §8).

A backend gathers the facts a rule needs inside its transaction (the session's expiry, its
active turns, a turn's unanswered calls…), asks the rule, and carries out the answer with its
own statements. So admitting a turn, what each ending does to a turn's items, recovering a dead
owner's turn, the terminal event, the seqs of new items and events and the first fencing token
mean the same thing on every backend. What is a single conditional write — taking or renewing
a lease, a cancel request, the sweep — each backend states in its own words (SQL ``WHERE``
clauses, or :func:`sweepable` for the in-memory store), held to one behaviour by the
conformance suite.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Final, Literal, cast, get_args

from tether import events
from tether.errors import (
    AgentChanged,
    Conflict,
    DecisionMade,
    IdempotencyKeyReused,
    InvalidInput,
    LimitExceeded,
    QueueFull,
    SessionBusy,
    SessionNotFound,
    TurnNotNext,
)
from tether.records import (
    ABORTED_TOOL_RESULT,
    EXCLUDED_STATUSES,
    AgentRef,
    CancelStatus,
    Decision,
    DecisionStatus,
    Document,
    EndStatus,
    Idempotency,
    Item,
    MemoryRecord,
    MemoryWrites,
    Namespace,
    NewDecision,
    NewEvent,
    NewItem,
    Policy,
    PrincipalLimits,
    Reason,
    SessionKey,
    SessionOrder,
    SessionRecord,
    Turn,
    TurnEnding,
    TurnStatus,
    Usage,
    Verdict,
)

DEFAULT_MAX_QUEUE: Final = 16
"""Queued turns a session may hold before ``enqueue`` answers QueueFull (DESIGN §4)."""

QUEUED_EVENT_SEQ: Final = 1
"""``turn.queued`` is every turn's first event, written when the turn is accepted."""


# -- fencing ---------------------------------------------------------------------------------------
def initial_token() -> int:
    """The first fencing token of a new session.

    Tokens only ever grow for one session row; starting a new row at the clock (in
    microseconds) keeps them growing across a delete and re-create of the same id too, so a
    lease from before the delete can never match a lease after it.
    """
    return int(time.time() * 1_000_000)


def stale_message(token: int, current: int) -> str:
    return f"lease token {token} is stale (current {current})"


# -- admitting a turn ------------------------------------------------------------------------------
def is_expired(expires_at: float | None, now: float) -> bool:
    """Past the TTL (the same test as :meth:`SessionRecord.expired`, on a row's column)."""
    return expires_at is not None and expires_at <= now


def sweepable(
    expires_at: float | None,
    now: float,
    *,
    active: bool,
    lease_owner: str | None,
    lease_expires_at: float,
) -> bool:
    """A session the sweeper may delete: expired and idle — no queued or running turn and no
    unexpired lease — so a sweep never pulls a session from under a turn (the SQL backends
    say the same in their ``SWEEP_EXPIRED`` statement)."""
    lease_free = lease_owner is None or lease_expires_at <= now
    return is_expired(expires_at, now) and not active and lease_free


def admit(
    policy: Policy,
    *,
    expires_at: float | None,
    now: float,
    active: Sequence[tuple[str, str]],
    max_queue: int,
) -> None:
    """Raise unless a turn with ``policy`` may join the session now.

    ``active`` is ``(id, status)`` of the session's queued and running turns in seq order (one
    read). The caller holds whatever makes these facts stay true until its insert commits (a
    lock, a transaction, no await in between).
    """
    if is_expired(expires_at, now):
        raise SessionNotFound("the session has expired")
    if policy == "reject":
        refuse_if_busy(active[0][0] if active else None)
    queued = [turn_id for turn_id, status in active if status == "queued"]
    if len(queued) >= max_queue:
        # A bound of 0 refuses on an idle session too, where no turn is there to name.
        raise QueueFull(
            f"the session already has {len(queued)} queued turns",
            busy_turn_id=queued[0] if queued else None,
        )


def refuse_if_busy(first_active: str | None) -> None:
    """Raise SessionBusy when a turn is queued or running (clearing history waits for idle)."""
    if first_active is not None:
        raise SessionBusy("a turn is queued or running", busy_turn_id=first_active)


IDEMPOTENCY_WINDOW: Final = 24 * 3600.0
"""Seconds an idempotency key keeps answering with its turn."""


def request_digest(input: str, policy: Policy, agent: AgentRef | None) -> str:
    """What a submission asked, to tell a retry (same digest) from a different request."""
    what = json.dumps([input, policy, agent.name if agent else None], ensure_ascii=True)
    return hashlib.sha256(what.encode()).hexdigest()


def replays(stored_digest: str | None, created_at: float, asked: Idempotency, now: float) -> bool:
    """Whether a submission with a known key is answered with the stored turn: yes within the
    window when it asks the same; IdempotencyKeyReused when it asks something else; no once
    the window is over (the key may then name a new turn)."""
    if now - created_at > IDEMPOTENCY_WINDOW:
        return False
    if stored_digest != asked.digest:
        raise IdempotencyKeyReused(
            f"idempotency key {asked.key!r} was used for another request on this session"
        )
    return True


def idempotency_args(asked: Idempotency | None) -> tuple[str | None, str | None]:
    """The ``idempotency_key`` and ``request_digest`` columns of a turn row."""
    return (asked.key, asked.digest) if asked is not None else (None, None)


def bounds_turns(limits: PrincipalLimits | None) -> bool:
    """Whether ``limits`` bound the principal's turns at all: when not, an admission neither
    counts them nor (PostgreSQL) takes the owner's lock, which every admission of the owner
    waits for until the holder has committed."""
    return limits is not None and (
        limits.running_turns is not None or limits.queued_turns is not None
    )


def admit_for_principal(
    limits: PrincipalLimits | None, *, busy_sessions: int, active_turns: int, session_active: bool
) -> None:
    """Refuse a turn over the principal's bounds (LimitExceeded → 429, nothing written).

    ``busy_sessions``: the principal's sessions with a queued or running turn; ``active_turns``:
    those turns. A turn on an idle session starts at once, so it needs room among the busy
    sessions; one behind a busy session (or preempting it) waits, so it needs room among the
    turns waiting behind others (each busy session's first active turn is under way, not
    waiting).
    """
    if limits is None:
        return
    queued = active_turns - busy_sessions
    if session_active:
        if limits.queued_turns is not None and queued >= limits.queued_turns:
            raise LimitExceeded(
                f"{queued} of your turns are queued; the limit is {limits.queued_turns}"
            )
    elif limits.running_turns is not None and busy_sessions >= limits.running_turns:
        raise LimitExceeded(
            f"{busy_sessions} of your sessions have a turn under way;"
            f" the limit is {limits.running_turns}"
        )


def newest_cursor(record: SessionRecord) -> str:
    """The cursor after ``record`` in a listing of the most recently active sessions first: its
    ``updated_at`` (exactly, as text of the float) and its id, which breaks ties."""
    return f"{record.updated_at!r}|{record.key.session_id}"


def parse_newest_cursor(cursor: str | None) -> tuple[float, str] | None:
    """``(updated_at, session_id)`` of a :func:`newest_cursor`; InvalidInput when it is none."""
    if cursor is None:
        return None
    stamp, sep, session_id = cursor.partition("|")
    try:
        if not sep or not session_id:
            raise ValueError(cursor)
        return float(stamp), session_id
    except ValueError:
        raise InvalidInput("the cursor is not one this listing gave") from None


def listed(
    records: Iterable[SessionRecord],
    *,
    order: SessionOrder,
    after: str | None,
    contains: str | None,
    limit: int,
) -> list[SessionRecord]:
    """A listing's page from all of an owner's sessions (the in-memory store's, and the rule
    the SQL backends' queries implement)."""
    chosen = [r for r in records if contains is None or contains in r.key.session_id]
    if order == "newest":
        chosen.sort(key=lambda r: (-r.updated_at, r.key.session_id))
        past = parse_newest_cursor(after)
        if past is not None:
            chosen = [r for r in chosen if (-r.updated_at, r.key.session_id) > (-past[0], past[1])]
    else:
        chosen.sort(key=lambda r: r.key.session_id)
        chosen = [r for r in chosen if after is None or r.key.session_id > after]
    return chosen[: max(limit, 0)]


def admit_session(max_sessions: int | None, existing: int) -> None:
    if max_sessions is not None and existing >= max_sessions:
        raise LimitExceeded(
            f"you have {existing} sessions; the limit is {max_sessions} (delete some first)",
            retry_after=60.0,
        )


def keeps_memory(status: EndStatus) -> bool:
    """Whether an ending applies the turn's memory writes: only when its items are kept."""
    return status not in EXCLUDED_STATUSES


CONVERSATION_AUTHORS: Final = ("auto", "model")
"""Authors of memory a session's turns wrote (automatic notes, the model's ``remember``):
clearing the session's history clears these session-scope records with it."""


def agent_args(agent: AgentRef | None) -> tuple[str | None, str | None]:
    """The ``agent`` and ``agent_fingerprint`` columns of a turn row."""
    return (agent.name, agent.fingerprint) if agent is not None else (None, None)


def queued_turn(
    turn_id: str,
    key: SessionKey,
    seq: int,
    input: str,
    policy: Policy,
    now: float,
    agent: AgentRef | None = None,
) -> Turn:
    """The record of a turn just admitted at ``seq``."""
    return Turn(
        id=turn_id,
        key=key,
        seq=seq,
        input=input,
        policy=policy,
        status="queued",
        reason=None,
        error=None,
        output=None,
        complete=False,
        usage=Usage(),
        created_at=now,
        started_at=None,
        ended_at=None,
        agent=agent,
    )


def queued_event(turn: Turn) -> NewEvent:
    return NewEvent(QUEUED_EVENT_SEQ, events.TURN_QUEUED, {"seq": turn.seq})


def duplicate_turn(turn_id: str) -> Conflict:
    return Conflict(f"turn {turn_id} already exists")


# -- a turn's writes -------------------------------------------------------------------------------
def not_in_status(turn_id: str, status: TurnStatus) -> Conflict:
    """The error of a fenced write whose turn is not (any longer) in ``status``."""
    return Conflict(f"turn {turn_id} is not {status}")


def agent_changed(expected: str, found: str) -> AgentChanged:
    """The error of an admission that expected the session's own agent to be ``expected``."""
    return AgentChanged(f"the session's agent is {found!r}, not {expected!r} as expected")


def not_next(turn_id: str) -> TurnNotNext:
    """The error of a start of a queued turn that an earlier active turn of its session
    precedes. A start is refused for its status first: only a queued turn is ever not next."""
    return TurnNotNext(f"turn {turn_id} is not next: an earlier turn of its session is active")


ITEM_SEQ_GAP: Final = 1
"""How far a change to a session's items other than an append moves its next item seq.

Clearing the history and ending a waiting turn (its items deleted or excluded, calls answered)
can happen without the session's lease. Leaving a gap in the seqs after them lets the lease's
holder, which knows the seq its next write should get, notice that the history moved under it
(a cached window is then read again: scheduler/history.py)."""


def stored_items(turn_id: str, first_seq: int, items: Sequence[NewItem], now: float) -> list[Item]:
    """The records of ``items`` as written: consecutive seqs from ``first_seq`` (the session's
    next item seq, taken in the same transaction), in the order the turn produced them."""
    return [
        Item(
            seq=first_seq + n,
            turn_id=turn_id,
            kind=new.kind,
            content=new.content,
            complete=new.complete,
            call_id=new.call_id,
            tool_name=new.tool_name,
            arguments=new.arguments,
            meta=dict(new.meta),
            created_at=now,
        )
        for n, new in enumerate(items)
    ]


def check_event_seqs(turn_id: str, last: int, seqs: Sequence[int]) -> None:
    """Events are written once each, in a turn's seq order: every new seq is past ``last`` (the
    highest already written) and none repeats. Checked before anything is written, so a
    refused write changes nothing."""
    if not seqs:
        return
    if min(seqs) <= last or len(set(seqs)) != len(seqs):
        raise Conflict(f"an event seq of turn {turn_id} was already written")


# -- endings ---------------------------------------------------------------------------------------
ItemsEffect = Literal["keep", "exclude", "delete"]


def items_effect(status: TurnStatus) -> ItemsEffect:
    """What an ending does to the turn's items (DESIGN §3).

    ``rolled_back``: they are removed, as if the turn never ran. ``failed``: they are kept for
    audit but excluded, so no later prompt shows the model an error as if it had said it.
    Every other ending keeps them (a partial reply is already flagged ``complete=False``).
    """
    if status == "rolled_back":
        return "delete"
    if status == "failed":
        return "exclude"
    return "keep"


def ended(turn: Turn, ending: TurnEnding, now: float) -> Turn:
    """The turn's record once ``ending`` is written."""
    return replace(
        turn,
        status=ending.status,
        reason=ending.reason,
        error=ending.error,
        output=ending.output,
        complete=ending.complete,
        usage=ending.usage,
        ended_at=now,
        ran_by=ending.agent,
    )


def usage_data(u: Usage) -> dict[str, int]:
    return {
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "model_calls": u.model_calls,
    }


def terminal_event_data(turn_id: str, ending: TurnEnding) -> dict[str, Any]:
    """The body of a turn's ``turn.ended`` event; one shape for every writer of it."""
    return {
        "turn_id": turn_id,
        "status": ending.status,
        "reason": ending.reason,
        "output": ending.output,
        "complete": ending.complete,
        "error": ending.error,
        "usage": usage_data(ending.usage),
        "agent": ending.agent,  # who answered, after any handoff (the turn's ran_by)
    }


LIVE_AHEAD: Final = 1024
"""How far a running turn's live events may run ahead of those stored: its writer publishes an
event at once and stores it with the next flush (:class:`tether.scheduler.sink.FencedSink`),
and holds it back while this many published events are not stored yet."""


def terminal_event(turn_id: str, ending: TurnEnding, last_seq: int) -> NewEvent:
    """``turn.ended`` after the turn's last written event (store-side endings: a queued turn
    cancelled, a dead owner's turn recovered; a running turn's own writer emits its own).

    A dead owner may have published events it never stored (up to :data:`LIVE_AHEAD`), which
    followers saw with their seqs: its ending comes after all of them, or a follower resuming
    after the last one it saw would be told of an ending with a seq it had already passed, and
    wait for ever (ids skip; a seq is never given to two events)."""
    after = last_seq + LIVE_AHEAD if ending.reason == "owner_lost" else last_seq
    return NewEvent(after + 1, events.TURN_ENDED, terminal_event_data(turn_id, ending))


# -- recovery --------------------------------------------------------------------------------------
OWNER_LOST: Final = TurnEnding(
    status="failed", reason="owner_lost", error="the process running the turn was lost"
)
"""How a turn left ``running`` by a process that lost its lease ends (DESIGN §4)."""


def owner_lost(turn: Turn) -> TurnEnding:
    """:data:`OWNER_LOST` for ``turn``, keeping the usage stored with it (what a turn spent
    before it parked on a decision is known; what its lost process spent since is not)."""
    return replace(OWNER_LOST, usage=turn.usage)


def unanswered_calls(items: Iterable[Item]) -> list[tuple[str | None, str | None]]:
    """``(call_id, tool_name)`` of the tool calls among ``items`` (one turn's, in seq order)
    that have no result."""
    items = list(items)
    # As the SQL backends' ORPHAN_CALLS: a call without an id can have no result.
    answered = {i.call_id for i in items if i.kind == "tool_result" and i.call_id is not None}
    return [
        (i.call_id, i.tool_name)
        for i in items
        if i.kind == "tool_call" and i.call_id not in answered
    ]


def aborted_results(calls: Iterable[tuple[str | None, str | None]]) -> list[NewItem]:
    """A result for each unanswered call, so every call keeps its pair (DESIGN §3)."""
    return [
        NewItem("tool_result", ABORTED_TOOL_RESULT, call_id=call_id, tool_name=tool)
        for call_id, tool in calls
    ]


# -- memory and knowledge --------------------------------------------------------------------------
PERSONAL_SCOPES: Final = ("session", "user")
"""The scopes a user's data lives in: what ``forget_user`` deletes (agent and tenant stay)."""

# The English stop words of Snowball, the list PostgreSQL's 'english' configuration drops from
# every query. SQLite and the in-memory store drop them too: all backends then agree that "the"
# matches nothing, and in SQLite, whose FTS5 has no stop list, such a word would otherwise
# match nearly every record and make one search score them all.
_SNOWBALL_ENGLISH = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his
    himself she her hers herself it its itself they them their theirs themselves what
    which who whom this that these those am is are was were be been being have has had
    having do does did doing a an the and but if or because as until while of at by for
    with about against between into through during before after above below to from up
    down in out on off over under again further then once here there when where why how
    all any both each few more most other some such no nor not only own same so than too
    very s t can will just don should now
"""
STOP_WORDS: Final = frozenset(_SNOWBALL_ENGLISH.split())


def search_terms(terms: Sequence[str]) -> list[str]:
    """The terms worth searching for: without blanks and stop words, each once."""
    return list(dict.fromkeys(t for t in terms if t.strip() and t.lower() not in STOP_WORDS))


def provenance(record: MemoryRecord) -> tuple[str | None, str | None]:
    """``(turn_id, author)`` from the record's meta, kept in columns of their own."""
    turn_id, author = record.meta.get("turn_id"), record.meta.get("author")
    return (
        str(turn_id) if turn_id is not None else None,
        str(author) if author is not None else None,
    )


def document_chunks(
    document: Document, chunks: Sequence[tuple[MemoryRecord, bytes]]
) -> list[tuple[MemoryRecord, bytes]]:
    """The chunks as stored: each names the document (filled in when it is None).

    A chunk outside its document's namespace or collection is refused rather than stored
    where its document is not: deleting or forgetting the document would leave it behind.
    """
    if not document.collection:
        raise InvalidInput("a document belongs to a named collection ('' holds memory items)")
    out = []
    for record, embedding in chunks:
        if record.namespace != document.namespace or record.collection != document.collection:
            raise InvalidInput(f"chunk {record.id} is not in its document's namespace/collection")
        if record.document_id not in (None, document.id):
            raise InvalidInput(f"chunk {record.id} belongs to document {record.document_id}")
        out.append((replace(record, document_id=document.id), embedding))
    return out


# -- cancel requests -------------------------------------------------------------------------------
_CANCEL_STATUSES: Final = frozenset(get_args(CancelStatus))
_REASONS: Final = frozenset(get_args(Reason))


def cancel_request(status: object, reason: object) -> tuple[CancelStatus, Reason]:
    """A cancel request as read back from storage.

    What ``request_cancel`` writes comes back as it was. Anything else — a row written by an
    older release during a rolling upgrade (``"interrupt by turn …"``), or damaged — still
    ends its turn, never blocks the requests read with it: an unknown status as a plain
    cancel, an unknown reason as the code its status implies.
    """
    known: CancelStatus = cast(CancelStatus, status) if status in _CANCEL_STATUSES else "cancelled"
    if reason in _REASONS:
        return known, cast(Reason, reason)
    return known, _IMPLIED_REASON[known]


_IMPLIED_REASON: Final[dict[str, Reason]] = {
    "cancelled": "cancelled",
    "interrupted": "interrupt",
    "rolled_back": "rollback",
    "failed": "lease_lost",
}


# -- decisions -------------------------------------------------------------------------------------
ALWAYS_KEY: Final = "always_approve"
"""The session state key listing the tools a human approved for the rest of the session
(``always``): visible in the session's state, revocable by writing the state without them."""


def new_decision(key: SessionKey, turn_id: str, asked: NewDecision, now: float) -> Decision:
    """The record of a decision a turn asks for now, pending until its deadline."""
    return Decision(
        key=key,
        turn_id=turn_id,
        call_id=asked.call_id,
        kind=asked.kind,
        payload=dict(asked.payload),
        status="pending",
        created_at=now,
        deadline=now + asked.timeout,
    )


def decision_data(d: Decision) -> dict[str, Any]:
    """A decision as events and the wire show it (the session key is the caller's own)."""
    return {
        "turn_id": d.turn_id,
        "call_id": d.call_id,
        "kind": d.kind,
        "payload": d.payload,
        "status": d.status,
        "answer": d.answer,
        "decided_by": d.decided_by,
        "created_at": d.created_at,
        "deadline": d.deadline,
        "decided_at": d.decided_at,
    }


def decision_made_event(d: Decision, last_seq: int) -> NewEvent:
    """``decision.made`` after the turn's last event: written by whoever ends the decision
    (no lease: the turn is parked, so nothing else writes its events meanwhile)."""
    return NewEvent(last_seq + 1, events.DECISION_MADE, decision_data(d))


def settle(d: Decision, verdict: Verdict, answer: str | None, by: str, now: float) -> Decision:
    """The decision once ``verdict`` is given, or why it cannot be.

    DecisionMade when it is not pending (the first decision stands); InvalidInput for a verdict
    the kind does not take: an approval takes approve, deny or always (always only for a tool);
    a question takes an answer (one of its choices, when it has them) or deny (no answer).
    """
    if not d.pending:
        raise DecisionMade(f"the decision on call {d.call_id} is already {d.status}", decision=d)
    status: DecisionStatus
    if d.kind == "approval":
        if verdict == "answer":
            raise InvalidInput("an approval takes approve, deny or always, not an answer")
        if verdict == "always" and not d.payload.get("tool"):
            raise InvalidInput("always approves a tool; this decision is not about one")
        status = _APPROVAL_STATUS[verdict]
        answer = None
    elif verdict == "deny":
        status, answer = "denied", None
    elif verdict == "answer":
        if answer is None or not answer.strip():
            raise InvalidInput("the answer is empty: give its text (or deny the question)")
        choices = d.payload.get("choices")
        if choices and answer not in choices:
            raise InvalidInput(f"the answer must be one of: {', '.join(map(str, choices))}")
        status = "answered"
    else:
        raise InvalidInput("a question takes an answer (or deny), not approve or always")
    return replace(d, status=status, answer=answer, decided_by=by, decided_at=now)


_APPROVAL_STATUS: Final[dict[str, DecisionStatus]] = {
    "approve": "approved",
    "deny": "denied",
    "always": "always",
}


def expired(d: Decision, now: float) -> Decision:
    """A pending decision refused because nobody decided in time: nobody decided it."""
    return replace(d, status="expired", decided_by=None, decided_at=now)


def dropped(d: Decision, now: float) -> Decision:
    """A pending decision whose turn ended first (cancelled, interrupted, rolled back)."""
    return replace(d, status="cancelled", decided_by=None, decided_at=now)


def always_approved(state: dict[str, Any]) -> frozenset[str]:
    """The tools the session approved with ``always``."""
    names = state.get(ALWAYS_KEY)
    return (
        frozenset(n for n in names if isinstance(n, str))
        if isinstance(names, list)
        else frozenset()
    )


def with_always(state: dict[str, Any], tool: str) -> dict[str, Any]:
    """The session state with ``tool`` approved for the rest of the session."""
    return {**state, ALWAYS_KEY: sorted(always_approved(state) | {tool})}


ACTIVE_SKILLS_KEY: Final = "active_skills"
"""Session state key of the skills the model activated (``activate_skill``): visible in the
session's state, and revocable by writing the state without them, as ``always`` approvals."""


def active_skills(state: dict[str, Any]) -> tuple[str, ...]:
    """The skills the session activated, in the order they were activated."""
    names = state.get(ACTIVE_SKILLS_KEY)
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()


def with_state(state: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    """The session state with its key ``name`` set to ``value`` (removed when None), the other
    keys as they are: a fenced write changes only what the turn's owner keeps there."""
    changed = {k: v for k, v in state.items() if k != name}
    if value is not None:
        changed[name] = value
    return changed


def parked(turn: Turn, usage: Usage) -> Turn:
    """The turn's record once it waits for a decision."""
    return replace(turn, status="awaiting_input", usage=usage)


def held_memory_json(writes: MemoryWrites | None) -> str | None:
    """A parked turn's memory writes, kept with the turn until it ends (DESIGN §3: they are
    committed with the ending, and only if its items are kept)."""
    if not writes:
        return None
    return json.dumps(
        {
            "put": [
                {
                    "id": r.id,
                    "ns": r.namespace.key,
                    "kind": r.kind,
                    "content": r.content,
                    "collection": r.collection,
                    "document_id": r.document_id,
                    "meta": r.meta,
                    "revision": r.revision,
                    "created_at": r.created_at,
                    "updated_at": r.updated_at,
                    "embedding": base64.b64encode(e).decode(),
                }
                for r, e in writes.put
            ],
            "delete": [[ns.key, rid] for ns, rid in writes.delete],
        }
    )


def held_memory(text: str | None) -> MemoryWrites | None:
    if not text:
        return None
    data = json.loads(text)
    put = tuple(
        (
            MemoryRecord(
                id=p["id"],
                namespace=Namespace.from_key(p["ns"]),
                kind=p["kind"],
                content=p["content"],
                collection=p["collection"],
                document_id=p["document_id"],
                meta=p["meta"],
                revision=p["revision"],
                created_at=p["created_at"],
                updated_at=p["updated_at"],
            ),
            base64.b64decode(p["embedding"]),
        )
        for p in data["put"]
    )
    delete = tuple((Namespace.from_key(k), rid) for k, rid in data["delete"])
    return MemoryWrites(put, delete)


def waiting_ending(status: CancelStatus, reason: Reason, turn: Turn) -> TurnEnding:
    """How a turn nobody is running (queued, or parked on a decision) ends when it is cancelled,
    interrupted or rolled back: nothing was streamed, so nothing partial to keep; what it spent
    before it parked stays its usage."""
    return TurnEnding(status=status, reason=reason, usage=turn.usage)
