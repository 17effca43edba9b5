"""The records every layer shares: plain frozen dataclasses, no I/O.

Sessions and who owns them (:mod:`.sessions`), turns and their outcomes (:mod:`.turns`), history
items and events (:mod:`.items`), memory and knowledge (:mod:`.memory`), and ids (:mod:`.ids`).
Everything is re-exported here; import from ``tether.records``.
"""

from tether.records.ids import (
    SESSION_ID_PATTERN,
    new_call_id,
    new_document_id,
    new_memory_id,
    new_session_id,
    new_turn_id,
    validate_session_id,
)
from tether.records.items import ABORTED_TOOL_RESULT, Event, Item, ItemKind, NewEvent, NewItem
from tether.records.memory import (
    CHUNK,
    MEMORY_KINDS,
    SCOPES,
    Document,
    ForgetReport,
    Hit,
    MemoryKind,
    MemoryRecord,
    Namespace,
    Scope,
    VectorSnapshot,
)
from tether.records.sessions import (
    LOCAL_PRINCIPAL,
    ApiKey,
    Principal,
    SessionKey,
    SessionRecord,
    SessionStats,
)
from tether.records.turns import (
    ACTIVE_STATUSES,
    EXCLUDED_STATUSES,
    POLICIES,
    TERMINAL_STATUSES,
    CancelStatus,
    EndStatus,
    Lease,
    Policy,
    Reason,
    Turn,
    TurnEnding,
    TurnStatus,
    Usage,
)

__all__ = [
    "ABORTED_TOOL_RESULT",
    "ACTIVE_STATUSES",
    "CHUNK",
    "EXCLUDED_STATUSES",
    "LOCAL_PRINCIPAL",
    "MEMORY_KINDS",
    "POLICIES",
    "SCOPES",
    "SESSION_ID_PATTERN",
    "TERMINAL_STATUSES",
    "ApiKey",
    "CancelStatus",
    "Document",
    "EndStatus",
    "Event",
    "ForgetReport",
    "Hit",
    "Item",
    "ItemKind",
    "Lease",
    "MemoryKind",
    "MemoryRecord",
    "Namespace",
    "NewEvent",
    "NewItem",
    "Policy",
    "Principal",
    "Reason",
    "Scope",
    "SessionKey",
    "SessionRecord",
    "SessionStats",
    "Turn",
    "TurnEnding",
    "TurnStatus",
    "Usage",
    "VectorSnapshot",
    "new_call_id",
    "new_document_id",
    "new_memory_id",
    "new_session_id",
    "new_turn_id",
    "validate_session_id",
]
