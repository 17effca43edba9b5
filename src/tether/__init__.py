"""tether: run LLM agents for many conversations at once, with real isolation between them."""

from tether.agent import Agent, MemoryPolicy, RetryPolicy
from tether.app import AgentOS, App
from tether.errors import (
    AgentNotFound,
    ConfigError,
    Conflict,
    InvalidInput,
    InvalidSessionId,
    ModelError,
    NotFound,
    QueueFull,
    SessionBusy,
    SessionNotFound,
    StaleLease,
    StoreError,
    SyncInAsyncContext,
    TetherError,
    TooLarge,
    TurnFailed,
    TurnNotFound,
)
from tether.records import Event, Item, Principal, SessionKey, Turn
from tether.runtime import Runtime
from tether.session import Session
from tether.tools import Tool, ToolContext, tool

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentNotFound",
    "AgentOS",
    "App",
    "ConfigError",
    "Conflict",
    "Event",
    "InvalidInput",
    "InvalidSessionId",
    "Item",
    "MemoryPolicy",
    "ModelError",
    "NotFound",
    "Principal",
    "QueueFull",
    "RetryPolicy",
    "Runtime",
    "Session",
    "SessionBusy",
    "SessionKey",
    "SessionNotFound",
    "StaleLease",
    "StoreError",
    "SyncInAsyncContext",
    "TetherError",
    "TooLarge",
    "Tool",
    "ToolContext",
    "Turn",
    "TurnFailed",
    "TurnNotFound",
    "__version__",
    "tool",
]
