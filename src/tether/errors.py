"""The one exception tree of tether.

::

    TetherError
    ├── ConfigError              bad configuration or arguments (typed, never ValueError)
    ├── InvalidInput             a caller's input is malformed (HTTP 400)
    │   └── InvalidSessionId
    ├── TooLarge                 a size bound was exceeded (HTTP 413)
    ├── NotFound                 unknown *or foreign*: callers cannot tell which (HTTP 404)
    │   ├── SessionNotFound
    │   ├── TurnNotFound
    │   └── AgentNotFound
    ├── Conflict                 a precondition moved: revision, existing id (HTTP 409)
    ├── SessionBusy              policy=reject and a turn is queued or running (HTTP 409)
    │   └── QueueFull            policy=enqueue and the session's queue is at its bound (HTTP 429)
    ├── StaleLease               a write carried a fencing token that is no longer current
    ├── StoreError               the store failed or is unreachable (HTTP 503)
    ├── ShuttingDown             the server is draining and takes no new turns (HTTP 503)
    ├── ModelError               a provider failed; ``transient`` says if a retry may help
    │   └── ModelRequestsForbidden  a real provider was called while tests forbid it
    ├── TurnFailed               a turn ended in a status other than completed (carries the turn)
    └── SyncInAsyncContext       a blocking method was called from inside a running event loop

Control signals (cancellation) are not errors and stay out of this tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tether.records import Turn


class TetherError(Exception):
    """Base of every error tether raises on purpose."""


class ConfigError(TetherError):
    """Configuration or arguments that cannot work."""


class InvalidInput(TetherError):
    """A caller's input is malformed."""


class InvalidSessionId(InvalidInput):
    """A session id outside 1–128 characters of ``[A-Za-z0-9._:-]``."""


class TooLarge(TetherError):
    """A message, metadata or body is over its size bound."""


class NotFound(TetherError):
    """Unknown or foreign: callers must not be able to tell which."""


class SessionNotFound(NotFound):
    pass


class TurnNotFound(NotFound):
    pass


class AgentNotFound(NotFound):
    pass


class MemoryNotFound(NotFound):
    pass


class DocumentNotFound(NotFound):
    pass


class Conflict(TetherError):
    """A precondition (revision, uniqueness) no longer holds."""


class RevisionConflict(Conflict):
    """An update named a revision that is no longer current: someone else changed it first."""

    def __init__(self, message: str, *, current_revision: int | None) -> None:
        super().__init__(message)
        self.current_revision = current_revision


class Forbidden(TetherError):
    """The principal may see this but not change it (agent or tenant memory without admin)."""


class SessionBusy(TetherError):
    """A turn is queued or running and the policy does not allow another."""

    def __init__(self, message: str, *, busy_turn_id: str | None) -> None:
        super().__init__(message)
        self.busy_turn_id = busy_turn_id


class QueueFull(SessionBusy):
    """The session's queue of turns is at its bound."""


class StaleLease(TetherError):
    """A fenced write carried a token that is no longer the session's current one.

    The writer has lost ownership of the session; it must stop the turn and write nothing more.
    """


class StoreError(TetherError):
    """The store failed or cannot be reached."""


class ShuttingDown(TetherError):
    """The process is shutting down and accepts no new turns."""


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


class TurnFailed(TetherError):
    """A turn ended without a complete answer; ``turn`` holds its status, reason and error."""

    def __init__(self, turn: Turn) -> None:
        detail = f": {turn.error}" if turn.error else ""
        super().__init__(f"turn {turn.id} ended {turn.status} ({turn.reason}){detail}")
        self.turn = turn


class SyncInAsyncContext(TetherError):
    """A blocking method was called from inside a running event loop; use the async twin."""
