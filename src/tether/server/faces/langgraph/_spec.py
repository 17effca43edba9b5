"""What a run's body asks for, checked: the assistant, the new human message (or a resume
command), the policy, the stream modes and what becomes of the thread (see :mod:`.runs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tether.agent import Agent
from tether.records import Policy
from tether.server.faces.langgraph._common import assistant
from tether.server.faces.langgraph._errors import invalid
from tether.server.faces.langgraph._stream import stream_modes
from tether.server.faces.langgraph._wire import MULTITASK
from tether.server.state import ServerState

_REFUSED = (
    "interrupt_before",
    "interrupt_after",
    "webhook",
    "checkpoint",
    "checkpoint_id",
)


@dataclass(frozen=True)
class RunSpec:
    agent: Agent
    text: str | None
    """The new human message (None: the run resumes a parked turn with ``command``)."""
    command: dict[str, Any] | None
    policy: Policy
    modes: frozenset[str]
    on_disconnect: str
    create: bool
    keep: bool


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise invalid("a message's content may hold only text parts")
        return "".join(parts)
    raise invalid("a message's content must be text")


def _input_text(body: dict[str, Any]) -> str:
    """The last human message of ``input.messages``: the only new input of the turn."""
    given = body.get("input")
    messages = given.get("messages") if isinstance(given, dict) else None
    if isinstance(messages, dict):
        messages = [messages]
    if not isinstance(messages, list):
        raise invalid('input must be {"messages": [...]} with a human message')
    for message in reversed(messages):
        if isinstance(message, dict) and (
            message.get("role") in ("user", "human") or message.get("type") in ("user", "human")
        ):
            return _text(message.get("content"))
    raise invalid("input.messages holds no human message")


def run_spec(st: ServerState, body: dict[str, Any]) -> RunSpec:
    for name in _REFUSED:
        if body.get(name):
            raise invalid(f"{name} is not supported by this server")
    if body.get("after_seconds"):
        raise invalid("after_seconds is not supported by this server")
    agent = assistant(st, body.get("assistant_id"))
    strategy = body.get("multitask_strategy") or "reject"
    if strategy not in MULTITASK:
        raise invalid(f"multitask_strategy must be one of {', '.join(MULTITASK)}")
    on_disconnect = body.get("on_disconnect") or "continue"
    if on_disconnect not in ("cancel", "continue"):
        raise invalid("on_disconnect must be cancel or continue")
    if_not_exists = body.get("if_not_exists") or "reject"
    if if_not_exists not in ("create", "reject"):
        raise invalid("if_not_exists must be create or reject")
    on_completion = body.get("on_completion") or "delete"
    if on_completion not in ("delete", "keep"):
        raise invalid("on_completion must be delete or keep")
    command = body.get("command")
    if command is not None and not isinstance(command, dict):
        raise invalid("command must be an object")
    if command and body.get("input"):
        raise invalid("send input or command, not both")
    return RunSpec(
        agent=agent,
        text=None if command else _input_text(body),
        command=command or None,
        policy=MULTITASK[strategy],
        modes=stream_modes(body.get("stream_mode")),
        on_disconnect=on_disconnect,
        create=if_not_exists == "create",
        keep=on_completion == "keep",
    )
