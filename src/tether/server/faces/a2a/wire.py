"""A2A's JSON-RPC 2.0 envelope: both spellings of each method, their payloads, their errors.

A2A 1.0 names methods like its gRPC service (``SendMessage``…) and writes ProtoJSON (enums
``TASK_STATE_COMPLETED``, parts ``{"text": …}``); 0.3 said ``message/send``… with ``kind``
discriminators and lower-case states. The method name says which a caller speaks, and the
answer is written in the same one. Requests are validated and answers written with a2a-sdk's
own types: the 1.0 protobuf messages, and for 0.3 its pydantic models with the SDK's
conversions between the two. Everything past this module sees 1.0 messages only.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as v03
from a2a.types import a2a_pb2 as pb
from a2a.utils.error_handlers import A2A_DOMAIN, ERROR_INFO_TYPE
from a2a.utils.errors import (
    A2A_ERROR_REASONS,
    JSON_RPC_ERROR_CODE_MAP,
    A2AError,
    InvalidParamsError,
    InvalidRequestError,
    JSONParseError,
    MethodNotFoundError,
    PushNotificationNotSupportedError,
    UnsupportedOperationError,
    VersionNotSupportedError,
)
from a2a.utils.proto_utils import validate_proto_required_fields
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from pydantic import ValidationError

Dialect = Literal["1.0", "0.3"]
Op = Literal["send", "stream", "get", "cancel", "subscribe"]
Params = (
    pb.SendMessageRequest | pb.GetTaskRequest | pb.CancelTaskRequest | pb.SubscribeToTaskRequest
)
RequestId = str | int | None

VERSION_HEADER = "A2A-Version"

_V1: dict[str, tuple[Op, type[Params]]] = {
    "SendMessage": ("send", pb.SendMessageRequest),
    "SendStreamingMessage": ("stream", pb.SendMessageRequest),
    "GetTask": ("get", pb.GetTaskRequest),
    "CancelTask": ("cancel", pb.CancelTaskRequest),
    "SubscribeToTask": ("subscribe", pb.SubscribeToTaskRequest),
}
_V03: dict[str, Op] = {
    "message/send": "send",
    "message/stream": "stream",
    "tasks/get": "get",
    "tasks/cancel": "cancel",
    "tasks/resubscribe": "subscribe",
}
_PUSH = {
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/set",
    "tasks/pushNotificationConfig/get",
    "tasks/pushNotificationConfig/list",
    "tasks/pushNotificationConfig/delete",
}
_UNSUPPORTED = {"ListTasks", "GetExtendedAgentCard", "agent/getAuthenticatedExtendedCard"}

METHODS: tuple[str, ...] = (*_V1, *_V03)
"""The methods served, in both spellings."""

UNAUTHENTICATED = -32000
"""No A2A code says "who are you?": the first of JSON-RPC's implementation-defined server
errors, sent with HTTP 401 and ``WWW-Authenticate`` (what A2A asks of an HTTP binding)."""

# The codes 0.3 defined: a 1.0-only error (VersionNotSupported) is an internal error to 0.3.
_V03_CODES = frozenset({-32700, -32600, -32601, -32602, -32603, *range(-32007, -32000)})


@dataclass(eq=False)  # compared and hashed as the exception it is, by identity
class RpcError(Exception):
    """A JSON-RPC error answer: code, message and ``google.rpc.ErrorInfo`` (reason, metadata)."""

    code: int
    message: str
    reason: str
    metadata: dict[str, str] = field(default_factory=dict)
    domain: str = A2A_DOMAIN
    status: int = 200
    """HTTP status: 200 as JSON-RPC over HTTP has it, but 401 for a missing key."""
    headers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


def error(kind: type[A2AError], message: str, **metadata: str) -> RpcError:
    """One of A2A's errors (its JSON-RPC code and ErrorInfo reason, as a2a-sdk maps them)."""
    code = JSON_RPC_ERROR_CODE_MAP.get(kind, -32603)
    # a2a-sdk names no reason for a parse error; INTERNAL_ERROR would blame the server.
    fallback = "PARSE_ERROR" if kind is JSONParseError else "INTERNAL_ERROR"
    return RpcError(code, message, A2A_ERROR_REASONS.get(kind, fallback), metadata)


@dataclass(frozen=True)
class Call:
    """One JSON-RPC request, its params in A2A 1.0's types whichever spelling it came in."""

    id: RequestId
    method: str
    op: Op
    dialect: Dialect
    params: Params


def envelope(raw: bytes) -> tuple[dict[str, Any], RequestId]:
    """The request object in ``raw`` and its id, or RpcError (answered with a null id)."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise error(JSONParseError, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        # A list is a JSON-RPC batch: A2A has none.
        raise error(InvalidRequestError, "a request is one JSON-RPC object (no batches)")
    rid = body.get("id")
    if isinstance(rid, bool) or not isinstance(rid, str | int | None):
        raise error(InvalidRequestError, "id must be a string, a number or null")
    return body, rid


def dialect_of(method: object) -> Dialect:
    """The spelling a method name is in (1.0 for names of neither)."""
    return "0.3" if isinstance(method, str) and "/" in method else "1.0"


def parse(body: dict[str, Any], rid: RequestId, version: str | None) -> Call:
    """The call ``body`` makes, its params validated, or RpcError."""
    if body.get("jsonrpc") != "2.0":
        raise error(InvalidRequestError, "jsonrpc must be exactly '2.0'")
    method = body.get("method")
    if not isinstance(method, str) or not method:
        raise error(InvalidRequestError, "method must name an A2A method")
    params = body.get("params", {})
    if not isinstance(params, dict):
        raise error(InvalidParamsError, "params must be an object")
    _check_version(version)
    if method in _V1:
        op, kind = _V1[method]
        try:
            # Unknown fields are ignored, as a2a-sdk's own server does (forward compatibility).
            parsed = ParseDict(params, kind(), ignore_unknown_fields=True)
        except ParseError as exc:
            raise error(InvalidParamsError, f"invalid params for {method}: {exc}") from None
        return Call(rid, method, op, "1.0", _required(method, parsed))
    if method in _V03:
        return Call(rid, method, _V03[method], "0.3", _required(method, _parse_v03(method, params)))
    if method in _PUSH:
        raise error(PushNotificationNotSupportedError, "this agent sends no push notifications")
    if method in _UNSUPPORTED:
        raise error(UnsupportedOperationError, f"{method} is not served by this agent")
    raise error(MethodNotFoundError, f"no method {method!r} (see the agent card)")


def _required(method: str, params: Params) -> Params:
    """``params`` if every field A2A marks REQUIRED is there (a2a-sdk's own check)."""
    try:
        validate_proto_required_fields(params)
    except InvalidParamsError as exc:
        errors = exc.data.get("errors", []) if isinstance(exc.data, dict) else []
        fields = ", ".join(_camel(str(e.get("field", ""))) for e in errors) or "?"
        raise error(InvalidParamsError, f"invalid params for {method}: missing {fields}") from None
    return params


def _camel(field: str) -> str:
    """A proto field path as A2A's JSON spells it (``message.message_id`` → ``messageId``)."""
    head, *rest = field.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _check_version(version: str | None) -> None:
    """``A2A-Version`` may say 0.3 or 1.x (either spelling of a method then reads the same);
    anything else is a version this server does not speak."""
    said = (version or "").strip()
    if not said:
        return
    match = _VERSION.fullmatch(said)
    major, minor = (int(match[1]), int(match[2] or 0)) if match else (-1, -1)
    if not (major == 1 or (major, minor) == (0, 3)):
        raise error(
            VersionNotSupportedError,
            f"A2A version {said[:20]!r} is not served: use 1.0 or 0.3",
            supportedVersions="1.0,0.3",
        )


_VERSION = re.compile(r"(\d{1,4})(?:\.(\d{1,4}))?(?:\.\d{1,4})?")
"""``Major[.Minor[.patch]]``: the patch never matters (A2A §3.6)."""


def _parse_v03(method: str, params: dict[str, Any]) -> Params:
    """0.3 params through its pydantic models (which check ``kind``, roles…), then in 1.0."""
    try:
        if method in ("message/send", "message/stream"):
            sent = v03.MessageSendParams.model_validate(params)
            return conversions.to_core_send_message_request(
                v03.SendMessageRequest(id=0, params=sent)
            )
        if method == "tasks/get":
            query = v03.TaskQueryParams.model_validate(params)
            return conversions.to_core_get_task_request(v03.GetTaskRequest(id=0, params=query))
        named = v03.TaskIdParams.model_validate(params)
        if method == "tasks/cancel":
            return conversions.to_core_cancel_task_request(
                v03.CancelTaskRequest(id=0, params=named)
            )
        return conversions.to_core_subscribe_to_task_request(
            v03.TaskResubscriptionRequest(id=0, params=named)
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = f"invalid params for {method}: {where}: {first['msg']}"
        raise error(InvalidParamsError, message) from None
    except (ParseError, ValueError) as exc:
        raise error(InvalidParamsError, f"invalid params for {method}: {exc}") from None


# -- answers -----------------------------------------------------------------------------------
def result(call: Call, task: pb.Task) -> dict[str, Any]:
    """The JSON-RPC answer to ``send``, ``get`` or ``cancel``: the task, in the call's dialect."""
    if call.dialect == "0.3":
        out: Any = _v03_dump(conversions.to_compat_task(task))
    elif call.op == "send":
        out = MessageToDict(pb.SendMessageResponse(task=task))
    else:
        out = MessageToDict(task)
    return {"jsonrpc": "2.0", "id": call.id, "result": out}


def event(call: Call, item: pb.StreamResponse) -> dict[str, Any]:
    """One streamed event as its SSE ``data``: a JSON-RPC answer holding a StreamResponse."""
    if call.dialect == "1.0":
        return {"jsonrpc": "2.0", "id": call.id, "result": MessageToDict(item)}
    compat = conversions.to_compat_stream_response(item, call.id)
    update = compat.result
    if (
        isinstance(update, v03.TaskStatusUpdateEvent)
        and update.status.state == v03.TaskState.input_required
    ):
        # The stream ends here, as a2a-sdk's servers end it: 0.3 says so with ``final``.
        update.final = True
    dumped: dict[str, Any] = _v03_dump(compat)
    return dumped


def error_body(exc: RpcError, rid: RequestId, dialect: Dialect = "1.0") -> dict[str, Any]:
    if dialect == "0.3":
        code = exc.code if exc.code in _V03_CODES else -32603
        err: dict[str, Any] = {"code": code, "message": exc.message}
        if exc.metadata:
            err["data"] = dict(exc.metadata)
    else:
        info = {
            "@type": ERROR_INFO_TYPE,
            "reason": exc.reason,
            "domain": exc.domain,
            "metadata": dict(exc.metadata),
        }
        err = {"code": exc.code, "message": exc.message, "data": [info]}
    return {"jsonrpc": "2.0", "id": rid, "error": err}


def _v03_dump(model: v03.Task | v03.SendStreamingMessageSuccessResponse) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
