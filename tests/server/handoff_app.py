"""A support desk the handoff tests serve in a real ``tether serve``: triage hands bills to
billing and anything else to tech; billing hands back when asked. Each specialist streams (so
turns take a moment and overlap across sessions) a reply naming its own instructions and every
user message it was shown, so a test sees whose turn ran on which history."""

from __future__ import annotations

from tether import Agent, App, tool
from tether.models.base import ModelRequest
from tether.testing import Call, ScriptedModel, Slow, ToolCalls


def shown(request: ModelRequest) -> Slow:
    users = " | ".join(m.content for m in request.messages if m.role == "user")
    return Slow(f"{request.messages[0].content} saw: {users}", delay=0.005)


def triage_flow(request: ModelRequest) -> str | ToolCalls | Slow:
    last = request.messages[-1]
    if last.role == "tool":
        return f"triage: {last.content}"
    if "hello" in last.content:
        return shown(request)
    target = "billing" if "bill" in last.content else "tech"
    return ToolCalls(Call(f"transfer_to_{target}", {"reason": last.content}))


@tool(requires_approval=True)
def refund(order: str) -> str:
    """Refund an order (a human approves each refund)."""
    return f"refunded {order}"


def billing_flow(request: ModelRequest) -> str | Slow | ToolCalls:
    last = request.messages[-1]
    if last.role == "tool" and last.content.startswith("refunded"):
        return f"Billing: {last.content}"
    if last.role == "user" and "refund" in last.content:
        return ToolCalls(Call("refund", {"order": "A1"}))
    if "back" in last.content:
        return ToolCalls(Call("transfer_to_triage"))
    return shown(request)


billing = Agent(
    name="billing",
    instructions="Billing.",
    model=ScriptedModel(default=billing_flow),
    handoffs=["triage"],
    tools=[refund],
    description="invoices and refunds",
)
tech = Agent(name="tech", instructions="Tech.", model=ScriptedModel(default=shown))
triage = Agent(
    name="triage",
    instructions="Triage.",
    model=ScriptedModel(default=triage_flow),
    handoffs=[billing, tech],
)
app = App(agents=[triage])
