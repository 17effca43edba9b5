"""The one exception tree of tether.

::

    TetherError
    ├── ConfigError              bad configuration or arguments (also a ValueError)
    ├── InvalidInput             a caller's input is malformed (HTTP 400)
    │   └── InvalidSessionId     a session id outside 1-128 of [A-Za-z0-9._:-]
    ├── TooLarge                 a size bound was exceeded (HTTP 413)
    │   └── StorageQuotaExceeded  a user's memory and knowledge would outgrow their quota
    ├── NotFound                 unknown *or foreign*: callers cannot tell which (HTTP 404)
    │   ├── SessionNotFound
    │   ├── TurnNotFound
    │   ├── AgentNotFound
    │   ├── MemoryNotFound
    │   ├── DecisionNotFound
    │   └── DocumentNotFound
    ├── Conflict                 a precondition moved: revision, existing id (HTTP 409)
    │   ├── RevisionConflict     an update named a revision that is no longer current
    │   ├── DecisionMade         a decision that is not pending (carries the one made first)
    │   ├── TurnNotNext          a start of a turn an earlier active turn of its session precedes
    │   └── AgentChanged         an admission expected the session to name another agent
    ├── Unauthorized             no credentials, or unknown or revoked ones (HTTP 401)
    ├── Forbidden                readable but not writable by this principal (HTTP 403)
    ├── SessionBusy              policy=reject and a turn is queued or running (HTTP 409)
    │   └── QueueFull            policy=enqueue and the session's queue is at its bound (HTTP 429)
    ├── LimitExceeded            a per-principal bound: turns, sessions, storage (HTTP 429)
    ├── IdempotencyKeyReused     one idempotency key, two different requests (HTTP 422)
    ├── StaleLease               a write carried a fencing token that is no longer current
    ├── StoreError               the store failed or is unreachable (HTTP 503)
    ├── ShuttingDown             the server is draining and takes no new turns (HTTP 503)
    ├── SessionClosed            a Session object was used after its close()
    ├── ToolError                a tool's refusal, which the model reads as its result
    ├── ModelError               a provider failed; ``transient`` says if a retry may help
    │   ├── ModelRequestsForbidden  a real provider was called while tests forbid it
    │   └── ScriptExhausted      a ScriptedModel was asked for more than its script holds
    ├── TurnFailed               a turn ended in a status other than completed (carries the turn)
    ├── MiddlewareFailed         a Session's middleware raised after the turn was committed
    ├── DecisionRequired         a turn waits for a human and nobody was there to ask
    ├── RemoteError              a tether server answered a problem (its status, type, detail)
    │   ├── RemoteUnauthorized   401: the server wants an API key, or a valid one
    │   ├── RemoteForbidden      403
    │   ├── RemoteConflict       409 (a conflict the client has no own class for)
    │   ├── RemoteInvalidInput   400 or 422: the request was malformed or refused
    │   ├── RemoteTooLarge       413
    │   ├── RemoteLimitExceeded  429 (``retry_after`` from the server)
    │   ├── RemoteModelError     502: the server's model provider failed
    │   └── RemoteUnavailable    503: the server's store is down, or it is shutting down
    └── SyncInAsyncContext       a blocking method was called from inside a running event loop

The tree above is checked against the classes by a test: a new error is drawn here or the
suite fails.

Control signals (cancellation) are not errors and stay out of this tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # For the annotation only: records import errors at run time, never the other way round.
    from tether.records import Decision, Turn


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class ConfigError(TetherError, ValueError):
    """Configuration or arguments that cannot work.

    Also a ValueError, which is what the APIs tether implements document for a bad argument
    (``Session(session_ttl=-1)``): code written against them catches it either way."""


class InvalidInput(TetherError):
    """A caller's input is malformed."""


class InvalidSessionId(InvalidInput):
    """A session id outside 1–128 characters of ``[A-Za-z0-9._:-]``."""


class TooLarge(TetherError):
    """A message, metadata or body is over its size bound."""


class StorageQuotaExceeded(TooLarge):
    """Storing this would take a user past the memory and knowledge they may keep."""


class NotFound(TetherError):
    """Unknown or foreign: callers must not be able to tell which."""


class SessionNotFound(NotFound):
    """No such session in the caller's namespace (or it has expired)."""


class TurnNotFound(NotFound):
    """No such turn in the caller's session."""


class AgentNotFound(NotFound):
    """No agent of that name is served.

    Unlike the other NotFounds it may say so in full: which agents a server runs is no secret
    (``GET /v1/agents`` lists them), so ``known`` names them for the caller who mistyped one.
    """

    def __init__(self, message: str, *, known: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.known = tuple(known)


class MemoryNotFound(NotFound):
    """No such memory item the caller may read."""


class DecisionNotFound(NotFound):
    """No such decision on a turn the caller owns (unknown and foreign look the same)."""


class DocumentNotFound(NotFound):
    """No such knowledge document the caller may read."""


class Conflict(TetherError):
    """A precondition (revision, uniqueness) no longer holds."""


class RevisionConflict(Conflict):
    """An update named a revision that is no longer current: someone else changed it first."""

    def __init__(self, message: str, *, current_revision: int | None) -> None:
        super().__init__(message)
        self.current_revision = current_revision


class DecisionMade(Conflict):
    """The decision is not pending: decided already, or expired. ``decision`` is the first one
    (HTTP 409 carries it), so a second decider learns what was decided."""

    def __init__(self, message: str, *, decision: Decision) -> None:
        super().__init__(message)
        self.decision = decision


class TurnNotNext(Conflict):
    """A store refused to start a turn because an earlier turn of its session is still active
    (queued, running or parked): a session's turns start in the order they were accepted."""


class AgentChanged(Conflict):
    """An admission that named the agent its caller took the session to have found another
    one there (the session was changed, or deleted and made anew): nothing was written; read
    the session and try again."""


class Unauthorized(TetherError):
    """No credentials, or credentials that are unknown or revoked."""


class Forbidden(TetherError):
    """The principal may see this but not change it (agent or tenant memory without admin)."""


class SessionBusy(TetherError):
    """A turn is queued or running and the policy does not allow another."""

    def __init__(self, message: str, *, busy_turn_id: str | None) -> None:
        super().__init__(message)
        self.busy_turn_id = busy_turn_id


class QueueFull(SessionBusy):
    """The session's queue of turns is at its bound."""


class IdempotencyKeyReused(TetherError):
    """An idempotency key already named a different request on this session (HTTP 422)."""


class LimitExceeded(TetherError):
    """A per-principal bound (running or queued turns, sessions, storage) is reached: nothing
    was written; try again after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class StaleLease(TetherError):
    """A fenced write carried a token that is no longer the session's current one.

    The writer has lost ownership of the session; it must stop the turn and write nothing more.
    """


class StoreError(TetherError):
    """The store failed or cannot be reached."""


class ShuttingDown(TetherError):
    """The process is shutting down and accepts no new turns."""


class SessionClosed(TetherError):
    """A :class:`~tether.Session` object was used after ``close()``; its stored conversation
    stays, and a new ``Session`` with the same id opens it again."""


class ToolError(TetherError):
    """A tool's refusal or failure, in words meant for the model.

    Raised by a tool, it becomes the call's result as ``Error: <message>`` (any other exception
    is reported with its type): a path outside the workspace, a file over its limit, a missing
    sandbox. The turn goes on; the model reads why and may try something else.
    """


class ModelError(TetherError):
    """A model provider failed.

    ``transient`` errors (timeouts, 429, 5xx, dropped connections) are retried with backoff, up to a
    bound; the others fail the turn at once.
    """

    def __init__(self, message: str, *, transient: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


class ModelRequestsForbidden(ModelError):
    """A real model provider was called while ``tether.models.ALLOW_MODEL_REQUESTS`` is false."""


class ScriptExhausted(ModelError):
    """A :class:`~tether.testing.ScriptedModel` was called after its script ran out.

    A test that did not expect another model call fails loudly instead of reading a made-up
    reply; give the model a ``default`` to answer every further call.
    """


class TurnFailed(TetherError):
    """A turn ended without a complete answer; ``turn`` holds its status, reason and error."""

    def __init__(self, turn: Turn) -> None:
        detail = f": {turn.error}" if turn.error else ""
        super().__init__(f"turn {turn.id} ended {turn.status} ({turn.reason}){detail}")
        self.turn = turn


class DecisionRequired(TetherError):
    """A turn waits for a human decision and the caller gave no way to ask one
    (``on_decision``). ``decision`` is what it asks; decide it (``Session.decide``,
    ``Runtime.decide`` or ``POST …/decisions``) and the turn goes on; its deadline passing
    refuses it."""

    def __init__(self, decision: Decision, turn: Turn | None = None) -> None:
        what = decision.payload.get("question") or decision.payload.get("tool") or decision.kind
        super().__init__(
            f"turn {decision.turn_id} waits for a decision ({decision.kind}: {what});"
            " pass on_decision=, or decide it and the turn goes on"
        )
        self.decision = decision
        self.turn = turn


class MiddlewareFailed(TetherError):
    """A ``Session(middleware=[...])`` function raised. The turn had ended and is stored: only
    the middleware's work is missing. ``reply`` is the agent's reply as it stood (after the
    middleware before it), ``middleware`` the function, and the cause is chained."""

    def __init__(self, middleware: object, reply: str) -> None:
        name = getattr(middleware, "__name__", repr(middleware))
        super().__init__(f"middleware {name} raised; the turn itself is stored")
        self.middleware = middleware
        self.reply = reply


class RemoteError(TetherError):
    """A problem+json answer from a tether server (``status``, ``type``, ``detail``, ``body``)."""

    def __init__(self, status: int, type: str, detail: str, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.type = type
        self.detail = detail
        self.body = body


class RemoteUnauthorized(RemoteError):
    """The server refused the credentials (none, unknown or revoked): give ``api_key=``."""


class RemoteForbidden(RemoteError):
    """The server's principal may read this but not change it."""


class RemoteConflict(RemoteError):
    """The server said 409 for something the client has no class of its own for."""


class RemoteInvalidInput(RemoteError):
    """The server refused the request as malformed (400) or as not what its schema takes (422;
    ``body["errors"]`` says where)."""


class RemoteTooLarge(RemoteError):
    """The request (or a quota) was over a size bound on the server."""


class RemoteLimitExceeded(RemoteError):
    """Over a per-caller bound on the server; try again after ``retry_after`` seconds."""

    retry_after: float = 1.0


class RemoteModelError(RemoteError):
    """The server's model provider failed (the turn is in the body)."""


class RemoteUnavailable(RemoteError):
    """The server's store is unreachable, or the server is shutting down: retry later or
    elsewhere."""


class SyncInAsyncContext(TetherError):
    """A blocking method was called from inside a running event loop; use the async twin."""


def internal_error_message(exc: BaseException) -> str:
    """What a turn that failed on a fault of ours says (its ``error``, DESIGN §11): a short
    message of ours naming the kind of fault, never the exception's text (that goes to the log,
    which this points at)."""
    return f"an internal error ({type(exc).__name__}); the server's log has the details"
