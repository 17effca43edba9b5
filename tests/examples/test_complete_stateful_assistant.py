"""Sessions seed, complete example "Stateful Local Assistant": a session with memory and
knowledge (a real ``calendar.pdf``, made here), restored on the next run, whose assistant
answers from what it was given and whose state is saved for next time.

The example is run as the page has it, import line included (it names ``Task`` and
``AgentTeam``, which it never uses), twice, as two runs of a script are (the embedded runtime
closed in between, new objects).
"""

from __future__ import annotations

import pytest

from tests.examples.conftest import Seed, said
from tests.examples.test_memory_knowledge import write_pdf
from tether import Session

pytestmark = pytest.mark.real_model  # the fake OpenAI server is reached over real HTTP

IMPORT = "from tether import Session, Task, AgentTeam\n"

EXAMPLE = '''
# Create or restore session
session = Session(
    session_id="personal_assistant",
    user_id="john_doe",
    memory={
        "provider": "rag",
        "use_embedding": True
    },
    knowledge={
        "vector_store": {
            "provider": "chroma",
            "config": {"collection_name": "personal_docs"}
        }
    }
)

# Try to restore previous state
try:
    session.restore_state()
    print("Restored previous session")
except:
    print("Starting new session")

# Create session agent
assistant = session.Agent(
    name="Personal Assistant",
    instructions="""You are a personal assistant that remembers everything.
    Use your memory and knowledge to provide personalised help.""",
    memory=True,
    knowledge=True
)

# Add some knowledge
session.add_knowledge("calendar.pdf")
session.add_memory("User prefers morning meetings")

# Have a conversation
response = assistant.chat("Schedule a meeting for tomorrow")
print(response)

# Save state for next time
session.save_state()
'''

CALENDAR = (
    "Calendar for tomorrow: 09:00 to 10:30 free. 11:00 dentist appointment. "
    "14:00 to 17:00 quarterly planning workshop in room B."
)


def test_stateful_local_assistant_runs_twice(
    seed: Seed, capsys: pytest.CaptureFixture[str]
) -> None:
    write_pdf(seed.cwd / "calendar.pdf", CALENDAR)
    exec(IMPORT + EXAMPLE, {})
    first = seed.fake.chat_requests[-1]
    # The assistant answered with what the session holds: its memory and its knowledge.
    prompt = said(first)[0][1]
    assert prompt.startswith("You are a personal assistant that remembers everything.")
    assert "User prefers morning meetings" in prompt
    assert "09:00 to 10:30 free" in prompt
    assert capsys.readouterr().out.splitlines() == [
        "Restored previous session",  # restore_state() of a new session is {}, not an error
        "echo: Schedule a meeting for tomorrow",
    ]
    saved = Session(session_id="personal_assistant", user_id="john_doe").restore_state()
    assert saved["session"]["knowledge"] == {"collections": ["personal_docs"]}
    assert [a["name"] for a in saved["session"]["agents"]] == ["Personal Assistant"]

    seed.restart()  # the script ends; next time it runs again
    exec(IMPORT + EXAMPLE, {})
    again = said(seed.fake.chat_requests[-1])
    assert again[1:] == [
        ("user", "Schedule a meeting for tomorrow"),
        ("assistant", "echo: Schedule a meeting for tomorrow"),
        ("user", "Schedule a meeting for tomorrow"),
    ]
    # Adding the same PDF again replaced it: one document, not two.
    hits = Session(session_id="personal_assistant", user_id="john_doe").search_knowledge(
        "dentist appointment", collection="personal_docs", limit=10
    )
    assert len([h for h in hits if h["meta"].get("document") == "calendar.pdf"]) == 1
    assert Session(session_id="personal_assistant", user_id="john_doe").restore_state() == saved
