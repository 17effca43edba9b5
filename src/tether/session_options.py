"""What a :class:`~tether.session.Session` is given, checked and read into tether's terms:
its TTL, its agents' memory and knowledge options (PraisonAI's shapes included), and the
server and agent an ``agent_url`` names."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from tether.agent import MemoryPolicy
from tether.errors import ConfigError, InvalidInput
from tether.memory.knowledge import check_collection

DEFAULT_COLLECTION = "knowledge"


def collection_of(knowledge: object) -> str | None:
    """The collection a Session's ``knowledge=`` names: True or None the default one, False
    none, or PraisonAI's ``{"vector_store": {"provider": …, "config": {"collection_name": …,
    "path": …}}}`` — the collection name names tether's collection; provider and path are
    accepted and mean nothing here (tether keeps knowledge in its own store, the session's)."""
    if knowledge is None or knowledge is True:
        return DEFAULT_COLLECTION
    if knowledge is False:
        return None
    if not isinstance(knowledge, dict):
        raise ConfigError(f"knowledge must be True, False or a dict, not {knowledge!r}")
    store = knowledge.get("vector_store", knowledge)
    config = store.get("config", {}) if isinstance(store, dict) else {}
    if not isinstance(config, dict):
        raise ConfigError("knowledge vector_store config must be a dict")
    name = config.get("collection_name") or knowledge.get("collection") or DEFAULT_COLLECTION
    try:
        return check_collection(name)
    except InvalidInput as exc:
        raise ConfigError(f"knowledge collection_name {name!r}: {exc}") from None


MEMORY_BACKEND_OPTIONS = {"provider": str, "use_embedding": bool}
"""PraisonAI's memory backend options (``{"provider": "rag", "use_embedding": True}``: which
store, whether it embeds), accepted and meaning nothing here: tether keeps memory in its own
store, the session's, and always searches it by text and by embedding."""


def memory_options(memory: object) -> dict[str, Any]:
    """A Session's and ``Session.Agent``'s ``memory=``: True or None (the session's defaults),
    False (no recall, no notes), a dict or a MemoryPolicy/MemoryConfig (its options; the ids
    are the session's). A dict is checked here, when it is given, not at the first turn."""
    if memory is None or memory is True:
        return {}
    if memory is False:
        return {"scopes": [], "auto": False}
    if isinstance(memory, MemoryPolicy):
        chosen = {k: v for k, v in asdict(memory).items() if v != getattr(MemoryPolicy(), k)}
        for owned in ("session_id", "user_id", "session_ttl"):
            chosen.pop(owned, None)
        return chosen
    if isinstance(memory, dict):
        options = dict(memory)
        for name, kind in MEMORY_BACKEND_OPTIONS.items():
            if name in options and not isinstance(options.pop(name), kind):
                raise ConfigError(f"memory {name} must be a {kind.__name__}")
        MemoryPolicy.coerce(options)  # an unknown or malformed option is an error now
        return options
    raise ConfigError(f"memory must be True, False, a dict or a MemoryConfig, not {memory!r}")


def server_of(url: str) -> tuple[str, str | None]:
    """``(server base URL, agent name or None)`` of a Session's ``agent_url``: the server's
    own URL, or an agent's (``…/agent``, ``…/agents/<name>``)."""
    base = url.rstrip("/")
    head, _, last = base.rpartition("/")
    if last == "agent" and "://" in head:
        return head, None
    parent, _, agents = head.rpartition("/")
    if agents == "agents" and last and "://" in parent:
        return parent, last
    return base, None


def checked_ttl(ttl: object) -> float | None:
    """A session TTL in seconds, checked when the Session is made (a ValueError there, as
    documented, rather than at the first turn)."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl):
        raise ConfigError(f"session_ttl is a number of seconds, not {ttl!r}")
    if ttl <= 0:
        raise ConfigError(f"session_ttl must be positive (seconds), not {ttl!r}")
    return float(ttl)
