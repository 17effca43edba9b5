"""Sessions seed, "Multi-Agent Sessions" and "Session Middleware".

Multi-agent: the writer's turn runs with the writer's own instructions over the one shared
conversation, the researcher's exchange in its history (what the fake model was sent shows
both), the agents share the session's memory, and its saved state names both agents.
Middleware: ``logging_middleware`` runs after the turns of the session's agents, and what it
returns is the reply.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.examples.conftest import Seed, said
from tether import Session

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP


def test_multi_agent_session(seed: Seed) -> None:
    session = Session(session_id="team_session")
    session.add_memory("Our research and articles are for hospital administrators")

    # fmt: off
    # Create multiple agents in session
    researcher = session.Agent(
        name="Researcher",
        instructions="You research topics"
    )

    writer = session.Agent(
        name="Writer",
        instructions="You write content"
    )

    # Agents share session memory and knowledge
    research = researcher.chat("Research AI trends")
    article = writer.chat("Write an article about the research")

    # fmt: on
    assert research == "echo: Research AI trends"
    assert article == "echo: Write an article about the research"
    to_researcher, to_writer = seed.fake.chat_requests
    # Each turn ran with its own agent's instructions ...
    assert said(to_researcher)[0][1].startswith("You research topics")
    assert said(to_writer)[0][1].startswith("You write content")
    assert "You research topics" not in said(to_writer)[0][1]
    # ... over one conversation: the writer was sent the researcher's exchange.
    assert said(to_writer)[1:] == [
        ("user", "Research AI trends"),
        ("assistant", "echo: Research AI trends"),
        ("user", "Write an article about the research"),
    ]
    # Both read the session's memory.
    for request in (to_researcher, to_writer):
        assert "Our research and articles are for hospital administrators" in said(request)[0][1]
    # The session records who answered what.
    context = session.get_context()
    assert context["agents"] == ["Researcher", "Writer"]
    assert context["message_count"] == 4
    # And its saved state names both agents' configurations.
    session.save_state()
    agents = session.restore_state()["session"]["agents"]
    assert [(a["name"], a["instructions"]) for a in agents] == [
        ("Researcher", "You research topics"),
        ("Writer", "You write content"),
    ]


def test_session_middleware(seed: Seed, capsys: pytest.CaptureFixture[str]) -> None:
    # fmt: off
    def logging_middleware(message, response):  # type: ignore[no-untyped-def]  # as documented
        print(f"[{datetime.now()}] Message: {message}")
        print(f"[{datetime.now()}] Response: {response[:100]}...")
        return response

    session = Session(
        session_id="logged_session",
        middleware=[logging_middleware]
    )

    # fmt: on
    first = session.Agent(name="Assistant").chat("Hello there")
    second = session.Agent(name="Helper", instructions="You help").chat("And again")
    direct = session.chat("Through the session")

    assert (first, second, direct) == (
        "echo: Hello there",
        "echo: And again",
        "echo: Through the session",
    )
    logged = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert logged == [
        "Message: Hello there",
        "Response: echo: Hello there...",
        "Message: And again",
        "Response: echo: And again...",
        "Message: Through the session",
        "Response: echo: Through the session...",
    ]
