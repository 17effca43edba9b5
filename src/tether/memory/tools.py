"""Built-in memory tools an agent policy can turn on: ``remember``, ``search_knowledge``."""

from __future__ import annotations

from typing import Literal

from tether.memory.prompt import neutralise, provenance
from tether.tools.context import ToolContext
from tether.tools.tool import Tool, tool


@tool
async def remember(
    content: str,
    ctx: ToolContext,
    scope: Literal["session", "user"] = "user",
    kind: Literal["fact", "preference", "rule", "note"] = "fact",
) -> str:
    """Store a fact about the user or this conversation so it is recalled in later turns.

    Args:
        content: The fact, in one self-contained sentence (e.g. "The user's name is Alice.").
        scope: "user" keeps it for all of this user's conversations; "session" for this one.
        kind: fact, preference, rule or note.
    """
    if ctx.memory is None:
        return "Memory is not available here."
    record = await ctx.memory.remember(content, scope=scope, kind=kind)
    return f"Remembered ({record.namespace.scope} memory, id {record.id})."


@tool(read_only=True)
async def search_knowledge(query: str, ctx: ToolContext) -> str:
    """Search this agent's knowledge collections and return the best passages.

    Args:
        query: What to look for, in a few words.
    """
    if ctx.memory is None:
        return "Knowledge is not available here."
    hits = await ctx.memory.search_knowledge(query, limit=5)
    if not hits:
        return "No passage matched."
    return "\n".join(f"- {neutralise(h.record.content)} ({provenance(h)})" for h in hits)


def memory_tools(remember_tool: bool, knowledge_tool: bool) -> tuple[Tool, ...]:
    out: list[Tool] = []
    if remember_tool:
        out.append(remember)
    if knowledge_tool:
        out.append(search_knowledge)
    return tuple(out)
