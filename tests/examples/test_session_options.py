"""Sessions seed, "Local Session Options" and the "Use Cases" cards: each ``Session(...)`` as the
page writes it is accepted and means what it says. PraisonAI's store options (a memory
``provider``, ``use_embedding``, a vector store's ``provider`` and ``path``) are accepted and mean
nothing here: memory and knowledge live in tether's own store."""

from __future__ import annotations

import pytest

from tests.examples.conftest import Seed
from tether import ConfigError, Session

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP


def test_local_session_options(seed: Seed) -> None:
    # fmt: off
    session = Session(
        # Required
        session_id="unique_session_id",

        # Optional
        user_id="user_identifier",
        session_ttl=3600,  # Expire after 1 hour (None = never)

        # Memory configuration (use memory= consolidated param)
        memory=True,  # Enable memory with defaults

        # Knowledge configuration
        knowledge={
            "vector_store": {
                "provider": "chroma",
                "config": {
                    "collection_name": "session_knowledge",
                    "path": ".sessions/knowledge"
                }
            }
        }
    )

    # fmt: on
    agent = session.Agent(name="Assistant")
    session.add_knowledge("The office closes at 18:00 on Fridays.")
    agent.chat("When does the office close on Fridays?")
    remaining = session.time_to_expiry()
    assert remaining is not None and 3590 < remaining <= 3600
    context = session.get_context()
    assert context["expires_at"] == pytest.approx(context["created_at"] + 3600, abs=1)
    # The knowledge went to the collection named, in tether's store, and the agent read it.
    hits = session.search_knowledge("office hours on Friday")
    assert [(h["collection"], h["content"]) for h in hits] == [
        ("session_knowledge", "The office closes at 18:00 on Fridays.")
    ]
    assert "The office closes at 18:00 on Fridays." in str(
        seed.fake.chat_requests[-1]["messages"][0]["content"]
    )
    assert not (seed.cwd / ".sessions").exists()  # the path names nothing tether writes


def test_use_case_cards(seed: Seed) -> None:
    ticket_id, customer_id, user_id, project_id = "T-1042", "cust_77", "u_5", "apollo"

    # fmt: off
    # Customer Support
    session = Session(
        session_id=f"support_{ticket_id}",
        user_id=customer_id
    )
    # fmt: on
    assert (session.session_id, session.user_id) == ("support_T-1042", "cust_77")

    # fmt: off
    # Personal Assistants
    session = Session(
        session_id=f"assistant_{user_id}",
        memory={"provider": "rag"}
    )
    # fmt: on
    session.add_memory("Prefers meetings before noon")
    session.Agent(name="Assistant").chat("When should we meet?")
    assert "Prefers meetings before noon" in str(
        seed.fake.chat_requests[-1]["messages"][0]["content"]
    )

    # Collaborative Work: the card's `knowledge={...}` is a placeholder for the documented shape
    session = Session(
        session_id=f"project_{project_id}",
        knowledge={"vector_store": {"provider": "chroma", "config": {"collection_name": "team"}}},
    )
    assert session.collection == "team"

    # fmt: off
    # Distributed Systems: made without reaching the server (no request until a chat)
    session = Session(
        agent_url="https://agent.region.example.com"
    )
    # fmt: on
    assert session.is_remote and session.session_id  # the client mints the conversation's id
    session.close()


def test_memory_options_are_checked_when_the_session_is_made(seed: Seed) -> None:
    # What tether does not know is an error at once, not at the first turn.
    with pytest.raises(ConfigError, match="unknown memory options: provdier"):
        Session(session_id="s", memory={"provdier": "rag"})
    with pytest.raises(ConfigError, match="use_embedding"):
        Session(session_id="s", memory={"provider": "rag", "use_embedding": "yes"})
    # The store options PraisonAI documents are accepted beside tether's own.
    Session(session_id="s", memory={"provider": "rag", "use_embedding": True, "recall_limit": 3})
