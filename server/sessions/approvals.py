"""Calls waiting for the user's approval (a tool with ``approve = "always"``), per session.

``ask`` keeps the ``tool_approval`` frame while the turn waits on it (a reload's history frame
carries the pending ones, so a page opened later shows the question too) and returns the answer:
True to allow this call once, False when denied or when nobody answered within the timeout. Only
the waiting turn is held: it waits on an event, the session's other clients and every other session
go on. A stopped turn's wait ends with it and its question is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio


@dataclass
class Pending:
    frame: dict[str, Any]
    answered: anyio.Event = field(default_factory=anyio.Event)
    allow: bool = False


class Approvals:
    def __init__(self) -> None:
        self._pending: dict[str, Pending] = {}

    async def ask(self, frame: dict[str, Any], timeout: float) -> bool:
        pending = self._pending[frame["id"]] = Pending(frame)
        try:
            with anyio.move_on_after(timeout):
                await pending.answered.wait()
            return pending.allow
        finally:
            self._pending.pop(frame["id"], None)

    def decide(self, turn_id: str, call_id: str, allow: bool) -> bool:
        """Answer a waiting call; False when no call of ``turn_id`` waits under ``call_id``."""
        pending = self._pending.get(call_id)
        if pending is None or pending.frame["turn_id"] != turn_id or pending.answered.is_set():
            return False
        pending.allow = allow
        pending.answered.set()
        return True

    def frames(self) -> list[dict[str, Any]]:
        return [pending.frame for pending in self._pending.values()]
