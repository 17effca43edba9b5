"""The built-in ``ask_user`` tool (``Agent(ask_user=True)``): the model asks the human a question.

The loop parks the turn on a ``question`` Decision when the model calls it (DESIGN §7); once
the question is answered, declined or expired, the turn goes on and the tool itself runs with
the decision in its context, turning it into the result the model reads.
"""

from __future__ import annotations

from tether.tools.context import ToolContext
from tether.tools.tool import tool

NOT_ANSWERED = "The user did not answer the question; go on without the answer, or say so."


@tool
async def ask_user(question: str, ctx: ToolContext, choices: list[str] | None = None) -> str:
    """Ask the user a question and wait for the answer. Use it when you need information only
    the user has, or a choice only they can make.

    Args:
        question: The question, in one or two sentences.
        choices: Possible answers, when the user should pick one of them.
    """
    d = ctx.decision
    if d is None or d.status != "answered" or d.answer is None:
        return NOT_ANSWERED
    return f"The user answered: {d.answer}"
