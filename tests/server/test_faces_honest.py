"""One outcome, every door: a reply cut at the model's output cap is flagged incomplete on each
protocol face, in that protocol's own words (DESIGN §3: partial text is flagged incomplete)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from contextlib import closing
from typing import Any

import httpx
import pytest

from tests.server.conftest import Server
from tether import Session
from tether.testing.fake_openai import FakeLength, FakeOpenAIServer

CUT = "a reply cut at the cap"


def _sse(text: str) -> list[Any]:
    return [
        json.loads(line.removeprefix("data:").strip())
        for line in text.splitlines()
        if line.startswith("data:") and line.removeprefix("data:").strip().startswith("{")
    ]


def openai_chat(c: httpx.Client) -> tuple[str, bool]:
    body = {"model": "upstream", "messages": [{"role": "user", "content": "go"}]}
    choice = c.post("/v1/chat/completions", json=body).json()["choices"][0]
    return choice["message"]["content"], choice["finish_reason"] == "length"


def openai_responses(c: httpx.Client) -> tuple[str, bool]:
    out = c.post("/v1/responses", json={"model": "upstream", "input": "go"}).json()
    flagged = out["status"] == "incomplete"
    flagged = flagged and out["incomplete_details"] == {"reason": "max_output_tokens"}
    return out["output"][0]["content"][0]["text"], flagged


def a2a(c: httpx.Client) -> tuple[str, bool]:
    message = {
        "kind": "message",
        "role": "user",
        "parts": [{"kind": "text", "text": "go"}],
        "messageId": str(uuid.uuid4()),
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": message}}
    task = c.post("/a2a/upstream", json=body).json()["result"]
    return task["artifacts"][0]["parts"][0]["text"], (
        task["metadata"]["tether"]["reason"] == "max_output_tokens"
    )


def mcp(c: httpx.Client) -> tuple[str, bool]:
    params = {"name": "upstream", "arguments": {"message": "go"}}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    (answer,) = _sse(c.post("/mcp", json=body, headers=headers).text)
    result = answer["result"]["structuredContent"]
    return result["reply"], result["complete"] is False


def langgraph(c: httpx.Client) -> tuple[str, bool]:
    thread = c.post("/lg/threads", json={}).json()["thread_id"]
    body = {"assistant_id": "upstream", "input": {"messages": [{"role": "user", "content": "go"}]}}
    last = c.post(f"/lg/threads/{thread}/runs/wait", json=body).json()["messages"][-1]
    meta = last["response_metadata"]
    return last["content"], meta == {"finish_reason": "length", "complete": False}


def agui(c: httpx.Client) -> tuple[str, bool]:
    body = {
        "threadId": f"honest-{uuid.uuid4().hex}",
        "runId": "r1",
        "messages": [{"id": "m1", "role": "user", "content": "go"}],
        "state": {},
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    events = _sse(c.post("/agui/upstream", json=body).text)
    assert events[-1]["type"] == "RUN_FINISHED"
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    return text, events[-1]["result"]["complete"] is False


def api_chat(c: httpx.Client) -> tuple[str, bool]:
    out = c.post("/api/chat", json={"message": "go", "agent_name": "upstream"}).json()
    return out["response"], out.get("complete") is False


def remote_agent(c: httpx.Client) -> tuple[str, bool]:
    out = c.post("/agents/upstream", json={"message": "go"}).json()
    return out["content"], out["metadata"].get("complete") is False


FACES: dict[str, Callable[[httpx.Client], tuple[str, bool]]] = {
    "api chat": api_chat,
    "remote agent": remote_agent,
    "openai chat": openai_chat,
    "openai responses": openai_responses,
    "a2a": a2a,
    "mcp": mcp,
    "langgraph": langgraph,
    "agui": agui,
}


@pytest.mark.parametrize("face", list(FACES))
def test_a_reply_cut_at_the_cap_is_flagged_incomplete(
    face: str, server: Server, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeLength(CUT))
    with server.client() as c:
        text, flagged = FACES[face](c)
    assert text == CUT
    assert flagged, f"{face} reported a reply cut at the cap as complete"


def test_a_remote_sessions_reply_cut_at_the_cap_says_so(
    server: Server, fake_openai: FakeOpenAIServer
) -> None:
    fake_openai.script(FakeLength(CUT), "whole")
    with closing(Session(agent_url=server.url, agent_name="upstream")) as remote:
        cut = remote.chat("go")
        whole = remote.chat("again")
    assert (str(cut), cut.complete) == (CUT, False)
    assert (str(whole), whole.complete) == ("whole", True)
