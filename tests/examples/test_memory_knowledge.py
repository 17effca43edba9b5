"""Sessions seed, "Memory Integration" and "Knowledge Integration": a session's memory and
knowledge, added and searched directly, and used by the session's agents before they answer.
The knowledge snippet adds a real PDF (``research_paper.pdf``, made here) and a text."""

from __future__ import annotations

from pathlib import Path

import pytest
from fpdf import FPDF

from tests.examples.conftest import Seed
from tether import Session

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP

PAPER = (
    "Route planning with learned heuristics. We evaluated the planner on 480 regional "
    "depots over six months. Median delivery delay fell from 41 to 23 minutes, and fuel use "
    "per parcel dropped by 12 percent compared with the hand-tuned baseline."
)


def write_pdf(path: Path, *pages: str) -> None:
    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 5, text)
    path.write_bytes(bytes(pdf.output()))


def system_prompt(seed: Seed) -> str:
    return str(seed.fake.chat_requests[-1]["messages"][0]["content"])


def test_memory_integration(seed: Seed) -> None:
    # fmt: off
    # Session with memory configuration
    session = Session(
        session_id="chat_123",
        user_id="user_456",
        memory=True  # Enable memory with defaults
    )

    # Add memories directly
    session.add_memory("User prefers technical explanations")

    # Search memories
    memories = session.search_memory("preferences")

    # Agent automatically uses session memory
    agent = session.Agent(name="Assistant", memory=True)

    # fmt: on
    assert [m["content"] for m in memories] == ["User prefers technical explanations"]
    assert memories[0]["scope"] == "user"  # the session's user's: their other sessions too
    agent.chat("How do vaccines train the immune system? Keep to my preferred style.")
    # Recalled before the turn, into the prompt, as data.
    assert "User prefers technical explanations" in system_prompt(seed)


def test_knowledge_integration_with_a_real_pdf(seed: Seed) -> None:
    write_pdf(seed.cwd / "research_paper.pdf", PAPER)

    # fmt: off
    # Session with knowledge
    session = Session(
        session_id="research_session",
        user_id="researcher_1",
        knowledge={
            "vector_store": {
                "provider": "chroma",
                "config": {"collection_name": "research_docs"}
            }
        }
    )

    # Add knowledge to session
    session.add_knowledge("research_paper.pdf")
    session.add_knowledge("Important finding: AI improves efficiency by 40%")

    # Search knowledge
    results = session.search_knowledge("efficiency improvements")

    # Agents use session knowledge
    agent = session.Agent(
        name="Research Assistant",
        knowledge=True
    )

    # fmt: on
    assert results[0]["content"] == "Important finding: AI improves efficiency by 40%"
    assert {r["collection"] for r in results} == {"research_docs"}
    # The PDF was read and indexed: its text is found by what it says.
    from_pdf = session.search_knowledge("median delivery delay at regional depots")
    assert "Median delivery delay fell from 41 to 23 minutes" in from_pdf[0]["content"]
    assert (from_pdf[0]["meta"]["document"], from_pdf[0]["meta"]["page"]) == (
        "research_paper.pdf",
        1,
    )
    agent.chat("What efficiency improvements did the research find?")
    assert "AI improves efficiency by 40%" in system_prompt(seed)
    agent.chat("How much did the median delivery delay fall at the depots?")
    assert "from 41 to 23 minutes" in system_prompt(seed)
