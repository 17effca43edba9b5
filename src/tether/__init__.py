"""tether: run LLM agents for many conversations at once, with real isolation between them.

The names below are the whole public API (checked by ``tests/test_public_api.py``). The
templates, records and errors load at once; the runtime, the server app and the ``Session``
facade load when first used, so ``import tether`` stays light and loads no database driver.
"""

from typing import TYPE_CHECKING, Any

from tether.agent import Agent, MemoryConfig, MemoryPolicy, RetryPolicy
from tether.errors import (
    AgentNotFound,
    ConfigError,
    Conflict,
    DecisionMade,
    DecisionNotFound,
    DecisionRequired,
    IdempotencyKeyReused,
    InvalidInput,
    InvalidSessionId,
    LimitExceeded,
    ModelError,
    NotFound,
    QueueFull,
    SessionBusy,
    SessionClosed,
    SessionNotFound,
    StaleLease,
    StoreError,
    SyncInAsyncContext,
    TetherError,
    TooLarge,
    TurnFailed,
    TurnNotFound,
)
from tether.handoff import Handoff, handoff
from tether.records import Decision, Event, Item, Principal, SessionKey, Turn
from tether.tools import Tool, ToolContext, tool
from tether.version import __version__

if TYPE_CHECKING:
    from tether.app import AgentOS, App
    from tether.runtime import Runtime
    from tether.session import Session
    from tether.team import AgentTeam, Task


_LAZY = {
    "App": "tether.app",
    "AgentOS": "tether.app",
    "Runtime": "tether.runtime",
    "Session": "tether.session",
    "AgentTeam": "tether.team",
    "Task": "tether.team",
}


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tether' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


__all__ = [
    "Agent",
    "AgentNotFound",
    "AgentOS",
    "AgentTeam",
    "App",
    "ConfigError",
    "Conflict",
    "Decision",
    "DecisionMade",
    "DecisionNotFound",
    "DecisionRequired",
    "Event",
    "Handoff",
    "IdempotencyKeyReused",
    "InvalidInput",
    "InvalidSessionId",
    "Item",
    "LimitExceeded",
    "MemoryConfig",
    "MemoryPolicy",
    "ModelError",
    "NotFound",
    "Principal",
    "QueueFull",
    "RetryPolicy",
    "Runtime",
    "Session",
    "SessionBusy",
    "SessionClosed",
    "SessionKey",
    "SessionNotFound",
    "StaleLease",
    "StoreError",
    "SyncInAsyncContext",
    "Task",
    "TetherError",
    "TooLarge",
    "Tool",
    "ToolContext",
    "Turn",
    "TurnFailed",
    "TurnNotFound",
    "__version__",
    "handoff",
    "tool",
]
