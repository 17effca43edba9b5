"""A fake OpenAI-compatible HTTP server, for tests and benchmarks.

It speaks the wire format of ``/v1/chat/completions`` (streaming SSE and plain JSON),
``/v1/embeddings`` and ``/v1/models`` closely enough for the official ``openai`` SDK, and answers
deterministically: by default it echoes the last user message. Tests script what comes next
(text, tool calls, HTTP errors, cut streams) and read back every request body it received::

    with FakeOpenAIServer() as srv:
        srv.script(FakeToolCall("add", '{"a": 1}'), "done")
        model = OpenAIModel("fake", base_url=srv.base_url)
        ...
        assert srv.requests[0]["messages"][0]["role"] == "system"

The server runs uvicorn in a background thread with its own event loop, so it serves sync and
async tests alike. ``python -m tether.testing.fake_openai --port 0`` runs one as a process.
"""

from __future__ import annotations

from tether.testing.fake_openai._wire import fake_embedding
from tether.testing.fake_openai.replies import (
    FakeCut,
    FakeError,
    FakeLength,
    FakeReply,
    FakeToolCall,
    ReplyFunction,
    echo_reply,
)
from tether.testing.fake_openai.server import FakeOpenAIServer

__all__ = [
    "FakeCut",
    "FakeError",
    "FakeLength",
    "FakeOpenAIServer",
    "FakeReply",
    "FakeToolCall",
    "ReplyFunction",
    "echo_reply",
    "fake_embedding",
]
