"""Turns: their statuses and reasons (DESIGN §3), policies (§4), outcomes and leases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from tether.errors import InvalidInput
from tether.records.sessions import SessionKey

TurnStatus = Literal[
    "queued",
    "running",
    "awaiting_input",
    "completed",
    "cancelled",
    "interrupted",
    "rolled_back",
    "limit_reached",
    "failed",
]
# No "rejected": a submission the reject policy or a full queue refuses is answered 409/429
# and stores nothing, so no turn ever ends that way.
EndStatus = Literal[
    "completed", "cancelled", "interrupted", "rolled_back", "limit_reached", "failed"
]
CancelStatus = Literal["cancelled", "interrupted", "rolled_back", "failed"]
"""What a running turn may be asked to end as (``failed``: its process lost the lease)."""

TERMINAL_STATUSES: Final[frozenset[TurnStatus]] = frozenset(
    {"completed", "cancelled", "interrupted", "rolled_back", "limit_reached", "failed"}
)
ACTIVE_STATUSES: Final[frozenset[TurnStatus]] = frozenset({"queued", "running", "awaiting_input"})
"""Not ended: the session's order waits for these (a turn awaiting input holds its place)."""
# Items of turns that ended like this never reach a model again (DESIGN §3).
EXCLUDED_STATUSES: Final[frozenset[TurnStatus]] = frozenset({"failed", "rolled_back"})

Reason = Literal[
    # completed
    "answered",
    "finished_at_limit",
    "max_output_tokens",  # the reply was cut at the output cap: complete is False
    # limit_reached
    "loop",
    "max_iterations",
    "max_total_iterations",
    "token_budget",
    # failed
    "model_error",
    "internal_error",
    "agent_not_found",
    "agent_changed",
    "owner_lost",
    "lease_lost",
    # cancelled: who asked
    "cancelled",
    "caller_cancelled",
    "client_disconnected",
    "shutdown",
    "session_expired",
    "session_deleted",
    "user_data_deleted",
    # interrupted / rolled_back: a newer turn's policy
    "interrupt",
    "rollback",
]
"""The stable reason code a turn ends with, next to its status."""

Policy = Literal["enqueue", "reject", "interrupt", "rollback"]
POLICIES: Final[tuple[Policy, ...]] = ("enqueue", "reject", "interrupt", "rollback")


def check_submission(
    input: object, policy: object = "enqueue", idempotency_key: object = None
) -> None:
    """InvalidInput for a message that is not text (or holds a NUL), a policy that is not one
    of POLICIES, or an idempotency key that is not text: what every door checks before
    anything is stored (or sent to a remote server)."""
    if not isinstance(input, str):
        raise InvalidInput(f"a message is text (str), not {type(input).__name__}")
    if "\x00" in input:
        # Refused on every store alike: PostgreSQL's text cannot hold one, SQLite's can.
        raise InvalidInput("the message must not contain NUL characters")
    if policy not in POLICIES:
        raise InvalidInput(f"policy {policy!r}: use one of {', '.join(POLICIES)}")
    if idempotency_key is not None and not isinstance(idempotency_key, str):
        kind = type(idempotency_key).__name__
        raise InvalidInput(f"an idempotency key is text (str), not {kind}")


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A submission's idempotency key and a digest of what it asked (DESIGN §4): the same key
    again on the session within a day is answered with the turn it made, never a second."""

    key: str
    digest: str


@dataclass(frozen=True, slots=True)
class PrincipalLimits:
    """What one principal (tenant, user) may hold at once (DESIGN §11); None: unbounded.

    ``running_turns`` bounds the principal's sessions with a turn under way (so concurrent model
    calls), ``queued_turns`` the turns waiting behind them, ``sessions`` the sessions it keeps.
    """

    running_turns: int | None = None
    queued_turns: int | None = None
    sessions: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    model_calls: int = 0


@dataclass(frozen=True, slots=True)
class AgentRef:
    """The agent a turn was submitted for: its name and a digest of its definition.

    A turn runs exactly this template (DESIGN §2, §11): a process serving another definition
    under the same name ends the turn ``failed``/``agent_changed`` instead of running it.
    """

    name: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Turn:
    id: str
    key: SessionKey
    seq: int
    input: str
    policy: Policy
    status: TurnStatus
    reason: str | None
    """A :data:`Reason` once the turn has ended (stored as text: older rows may hold others)."""
    error: str | None
    output: str | None
    complete: bool
    usage: Usage
    created_at: float
    started_at: float | None
    ended_at: float | None
    agent: AgentRef | None = None
    """None for turns stored before turns named their agent: they run the session's agent."""
    ran_by: str | None = None
    """The agent the turn ended with: ``agent``'s name, or the agent a handoff passed the
    conversation to (:mod:`tether.handoff`); None until it ends, and for a turn that ended
    without running."""

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def agent_name(self) -> str:
        """The agent that answered (``ran_by``), else the one the turn was submitted for."""
        return self.ran_by or (self.agent.name if self.agent else "")


@dataclass(frozen=True, slots=True)
class TurnEnding:
    """How a turn ended, written with its last items in one fenced transaction."""

    status: EndStatus
    reason: Reason
    output: str | None = None
    complete: bool = False
    error: str | None = None
    usage: Usage = Usage()
    agent: str | None = None
    """The agent that ran the turn to this ending (after any handoff); None when none ran it."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Ownership of a session: writes are valid only while ``token`` is the current one."""

    key: SessionKey
    owner: str
    token: int
    expires_at: float
    left_running: bool | None = field(default=None, compare=False)
    """Whether a turn was left running when the lease was taken, as the store saw it then
    under its write lock (SQLite); None when it did not look. False spares the worker its
    look at the store before the first turn (:meth:`~tether.store.protocol.FencedWrites.recover`
    has nothing to end)."""
    queue: tuple[str, ...] | None = field(default=None, compare=False)
    """The ids of the session's active turns (queued, running, parked) in seq order, as the
    store saw them as it granted the lease, after the last change before the grant: none can
    have been queued unseen between that look and the grant. None when it did not look. The
    worker then knows the queue without reading it."""
    history_seq: int | None = field(default=None, compare=False)
    """The seq the session's next item gets, as the lease was granted (None: not told). With a
    token one past the previous lease's, and the seq that lease's holder expected next, nobody
    wrote to the history in between (a change without the lease leaves a gap in the seqs:
    :data:`~tether.store.rules.ITEM_SEQ_GAP`), and what the holder knew of it still holds."""


DecisionKind = Literal["approval", "question"]
DecisionStatus = Literal[
    "pending", "approved", "denied", "always", "answered", "expired", "cancelled"
]
"""``expired``: nobody decided before the deadline; ``cancelled``: the turn ended first (cancel,
interrupt, rollback); both refuse, and neither names a decider (``decided_by`` is None)."""
Verdict = Literal["approve", "deny", "always", "answer"]
"""What a human says to a pending decision (``answer`` carries the text of a question's answer)."""
VERDICTS: Final[tuple[Verdict, ...]] = ("approve", "deny", "always", "answer")


@dataclass(frozen=True, slots=True)
class Decision:
    """A question a turn put to a human and waits for (DESIGN §2, §7): a tool approval, an
    ``ask_user`` question, or whether to go on past the iteration limit.

    Stored in the turn's fenced transaction with the call it is about; answerable through any
    process; owned, like everything of a session, by its key.
    """

    key: SessionKey
    turn_id: str
    call_id: str
    """The tool call it is about (``ask_user`` and approvals), or ``limit-<step>`` for the
    iteration limit."""
    kind: DecisionKind
    payload: dict[str, Any]
    """``tool`` and ``arguments`` of an approval; ``question`` and ``choices`` of a question;
    ``steps`` (how many more) of the iteration limit."""
    status: DecisionStatus
    created_at: float
    deadline: float
    answer: str | None = None
    decided_by: str | None = None
    decided_at: float | None = None

    @property
    def pending(self) -> bool:
        return self.status == "pending"


@dataclass(frozen=True, slots=True)
class NewDecision:
    """A decision as the turn loop asks it; the store stamps it pending with its times."""

    call_id: str
    kind: DecisionKind
    payload: dict[str, Any] = field(default_factory=dict)
    timeout: float = 600.0
