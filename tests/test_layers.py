"""The front doors (HTTP server, CLI, App, the Session facade) reach sessions, turns, keys and
memory through the runtime's services, never through a store (DESIGN §12).

import-linter (``make imports``) checks which modules import which; this checks what the
front doors *call*, which imports alone cannot show (a store reaches them as an object).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import tether
from tether.keys import ApiKeys
from tether.memory.knowledge import KnowledgeService
from tether.memory.service import MemoryService
from tether.runtime import Runtime
from tether.scheduler import Scheduler
from tether.scheduler.sessions import SessionService
from tether.store.protocol import Store

SRC = Path(tether.__file__).parent
FRONT_DOORS = [
    *sorted((SRC / "server").rglob("*.py")),
    *sorted((SRC / "cli").rglob("*.py")),
    SRC / "app.py",
    SRC / "session.py",
]


def _methods(cls: type) -> set[str]:
    return {n for n, f in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}


# Store methods no service shares a name with: a call of one of these is a call on a store.
# Opening and closing a store to hand it to the services is a front door's job; "append" is
# every list's method too.
STORE_ONLY = (
    _methods(Store)
    - {"open", "close", "ping", "append"}
    - set().union(
        *(
            _methods(c)
            for c in (SessionService, MemoryService, KnowledgeService, ApiKeys, Runtime, Scheduler)
        )
    )
)


def test_the_store_only_method_list_is_not_empty() -> None:
    # Guards the guard: if the sets ever coincided, the test below would check nothing.
    assert {"enqueue_turn", "create_session", "delete_session", "count_api_keys"} <= STORE_ONLY
    assert len(STORE_ONLY) > 40


def test_front_doors_never_call_a_store() -> None:
    offences = []
    for path in FRONT_DOORS:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "store"
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "settings"))
            ):
                offences.append(f"{path.relative_to(SRC)}:{node.lineno}: .store")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in STORE_ONLY
            ):
                offences.append(f"{path.relative_to(SRC)}:{node.lineno}: .{node.func.attr}()")
    assert offences == []
