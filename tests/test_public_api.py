"""The public surface: an exact list of names, one error tree drawn exactly, a light import."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys

import tether
from tether import errors


def test_public_api_is_small_and_exact() -> None:
    assert sorted(tether.__all__) == sorted(
        [
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
            "InvalidInput",
            "InvalidSessionId",
            "Item",
            "MemoryConfig",
            "MemoryPolicy",
            "ModelError",
            "NotFound",
            "Principal",
            "IdempotencyKeyReused",
            "LimitExceeded",
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
    )
    for name in tether.__all__:
        assert hasattr(tether, name)


def test_every_error_is_a_tether_error() -> None:
    for name in tether.__all__:
        obj = getattr(tether, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, tether.TetherError), name


def _drawn_tree() -> dict[str, str | None]:
    """``class name → parent name`` as the errors module's docstring draws it."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].strip("\n").split("\n\n", 1)[0]
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in block.splitlines():
        m = re.match(r"^\s*((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w*)", line)
        assert m is not None, line
        depth = len(m.group(1)) // 4 + (1 if "── " in line else 0)
        del stack[depth:]
        parents[m.group(2)] = stack[-1] if stack else None
        stack.append(m.group(2))
    return parents


def _real_tree() -> dict[str, str | None]:
    out: dict[str, str | None] = {errors.TetherError.__name__: None}
    pending: list[type[errors.TetherError]] = [errors.TetherError]
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            out[sub.__name__] = cls.__name__
            pending.append(sub)
    return out


def _import_everything() -> None:
    """Import every module of the package, so no subclass of TetherError hides in one."""
    for module in pkgutil.walk_packages(tether.__path__, "tether."):
        if module.name != "tether.__main__":
            importlib.import_module(module.name)


def test_the_errors_docstring_draws_the_whole_tree() -> None:
    # Every subclass of TetherError, in whichever module it is defined, appears in the drawing
    # under its real parent, and nothing else does.
    _import_everything()
    assert _drawn_tree() == _real_tree()


def test_every_error_lives_in_the_errors_module() -> None:
    _import_everything()
    pending: list[type[errors.TetherError]] = [errors.TetherError]
    while pending:
        cls = pending.pop()
        assert cls.__module__ == "tether.errors", cls
        pending.extend(cls.__subclasses__())


def test_import_tether_loads_no_database_driver() -> None:
    # A script that only chats on SQLite should not pay for asyncpg (nor fail without it).
    code = (
        "import sys, tether; print(sorted(m for m in sys.modules if m.split('.')[0] == 'asyncpg'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_event_types_are_one_list() -> None:
    # The Literal, the constants and EVENT_TYPES name the same types, each once.
    from typing import get_args

    from tether import events

    # Each constant is its type's name: TURN_AWAITING_INPUT is "turn.awaiting_input".
    constants = {
        v
        for k, v in vars(events).items()
        if k.isupper() and isinstance(v, str) and v == k.lower().replace("_", ".", 1)
    }
    assert len(events.EVENT_TYPES) == len(set(events.EVENT_TYPES))
    assert set(get_args(events.EventType)) == set(events.EVENT_TYPES) == constants
