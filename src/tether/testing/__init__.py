"""Helpers for testing code that uses tether: scripted models and a fake OpenAI server."""

from tether.testing.scripted import (
    Call,
    EchoModel,
    Fail,
    ScriptedModel,
    Slow,
    ToolCalls,
    echo_responder,
    last_user_text,
    reply_to,
    transcript,
)

__all__ = [
    "Call",
    "EchoModel",
    "Fail",
    "ScriptedModel",
    "Slow",
    "ToolCalls",
    "echo_responder",
    "last_user_text",
    "reply_to",
    "transcript",
]
