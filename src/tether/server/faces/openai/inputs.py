"""What an OpenAI request asks for, read leniently where OpenAI is and strictly where a wrong
guess would run the wrong turn.

The conversation's history is tether's. With a session, only the **last** user message is new:
whatever the client resends before it is ignored, even where it disagrees with what is stored
(an edited or dropped message does not rewrite history; start a new session for that). With no
session, the call is a one-off: a fresh session whose one turn is given the earlier messages as
a transcript ahead of the last user message, so a stateless client's context is not lost.
System and developer messages never replace the agent's instructions (an agent is a template):
they are dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request

from tether.records import SESSION_ID_PATTERN
from tether.server.faces.openai.errors import SESSION_HEADER, FaceError

_TEXT_PARTS = ("text", "input_text", "output_text")


async def read_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError:
        raise FaceError(400, "the request body is not valid JSON", "malformed_json") from None
    if not isinstance(body, dict):
        raise FaceError(400, "the request body must be a JSON object", "invalid_body")
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise FaceError(
            400, "model must name one of this server's agents", "invalid_value", "model"
        )
    return model


def flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FaceError(400, f"{name} must be true or false", "invalid_value", name)
    return value


def no_client_tools(body: dict[str, Any]) -> None:
    """Tools are the agent's, run by tether; a client's own tools would never be called."""
    tools = body.get("tools")
    if tools:
        raise FaceError(
            400,
            "client-side tools are not supported: the agent's own tools run inside tether",
            "unsupported_parameter",
            "tools",
        )


def checked_session(session_id: object, param: str) -> str | None:
    if session_id is None or session_id == "":
        return None
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id):
        # Never echoed back: a header cannot hold what a JSON string can.
        raise FaceError(
            400,
            "a session id is 1-128 characters of letters, digits and '._:-'",
            "invalid_value",
            param,
        )
    return session_id


def header_session(request: Request) -> str | None:
    return checked_session(request.headers.get(SESSION_HEADER), SESSION_HEADER)


def text_of(content: object, param: str) -> str:
    """A message's text: a string, or a list of text parts (``text``, ``input_text``…), one
    line each (as vLLM and A2A's face join them: parts are separate, never glued words)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS):
                message = "only text content parts are supported"
                raise FaceError(400, message, "invalid_value", param)
            text = part.get("text", "")
            if not isinstance(text, str):
                raise FaceError(400, "a text part's text must be a string", "invalid_value", param)
            parts.append(text)
        return "\n".join(parts)
    raise FaceError(400, "a message's content must be text", "invalid_value", param)


def conversation_input(messages: Sequence[object], continuing: bool, param: str) -> str:
    """The turn's input from ``messages``: the last user message; for a one-off call
    (``continuing`` False) preceded by the earlier user and assistant messages as a
    transcript."""
    read: list[tuple[str, str]] = []
    last_role: object = None  # of the last user, assistant or tool message
    for message in messages:
        if not isinstance(message, dict):
            raise FaceError(400, f"each of {param} must be an object", "invalid_value", param)
        if message.get("type", "message") != "message":
            raise FaceError(
                400, "only message items are supported as input", "invalid_value", param
            )
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise FaceError(400, f"unknown role {role!r}", "invalid_value", param)
        if role in ("user", "assistant"):
            read.append((role, text_of(message.get("content"), param)))
        if role in ("user", "assistant", "tool"):
            last_role = role
    last = next((i for i in range(len(read) - 1, -1, -1) if read[i][0] == "user"), None)
    if last is None:
        raise FaceError(400, f"{param} holds no user message", "invalid_value", param)
    if last_role != "user":
        # The conversation as the client has it ends with the agent's reply (or a tool's
        # result): answering its last user message again would put a second answer in the
        # history.
        raise FaceError(
            400,
            f"{param} ends with {'a tool' if last_role == 'tool' else 'an assistant'} message, "
            "so there is nothing new to answer: send the user's new message last",
            "invalid_value",
            param,
        )
    text = read[last][1]
    earlier = read[:last]
    if continuing or not earlier:
        return text
    transcript = "\n".join(f"{role}: {said}" for role, said in earlier)
    return f"The conversation so far:\n{transcript}\n\nThe user's new message:\n{text}"
