"""Tool approvals decided over HTTP: a pending decision per (turn, call), failing closed."""

from __future__ import annotations

import asyncio

from tether.tools.approval import ApprovalRequest


class Approvals:
    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], asyncio.Future[bool]] = {}

    async def __call__(self, request: ApprovalRequest) -> bool:
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        slot = (request.turn_id, request.call_id)
        self._pending[slot] = fut
        try:
            return await fut  # the turn loop bounds this wait with the agent's approval_timeout
        finally:
            self._pending.pop(slot, None)

    def decide(self, turn_id: str, call_id: str, approve: bool) -> bool:
        """Deliver a decision; False when no such call is waiting (unknown, late or decided)."""
        fut = self._pending.get((turn_id, call_id))
        if fut is None or fut.done():
            return False
        fut.set_result(approve)
        return True
