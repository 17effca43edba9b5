"""What a turn said, message by message: the OpenAI face answers with all of it.

A model may write a few words, call a tool, then answer: the turn said two messages, and a
stream shows both as they come. ``turn.output`` is the last one only, so an answer read
afterwards (a plain chat completion, a response object) would say less than the stream did.
The face's answer is every message the turn said, in order: chat completions join them (a
stream sends :data:`SEPARATOR` between them too), the Responses API gives each its own
``message`` item.
"""

from __future__ import annotations

from tether.events import MESSAGE_COMPLETED
from tether.records import Turn
from tether.server.state import ServerState

SEPARATOR = "\n\n"
"""Between two messages of one turn, in a chat completion's content."""
_PAGE = 1000


async def said(st: ServerState, turn: Turn) -> list[str]:
    """The texts of the messages ``turn`` (ended) said, in order (none empty). A turn of one
    model call said its output alone, read without a store call."""
    if not turn.ended:
        return []  # nothing said yet, for an answer (its stream tells it as it comes)
    if turn.usage.model_calls <= 1:
        return [turn.output] if turn.output else []
    texts: list[str] = []
    after = 0
    while True:
        page = await st.runtime.sessions.stored_events(
            turn.key, turn.id, after_seq=after, limit=_PAGE
        )
        if not page:
            break
        after = page[-1].seq
        for event in page:
            if event.type == MESSAGE_COMPLETED and (text := str(event.data.get("text") or "")):
                texts.append(text)
        if len(page) < _PAGE:
            break
    return texts or ([turn.output] if turn.output else [])
