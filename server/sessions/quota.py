"""``Quota``: what one signed-in user may use (``[auth] user_turns``, ``daily_tokens``).

Checked when a message arrives, before anything is stored: more replies being written at once than
``user_turns`` (over all the user's sessions on this instance) is refused as ``busy``; a day's
spent tokens (input + output of every provider call of the user's sessions since 00:00 UTC, read
from the store, so every instance counts the same) at or over ``daily_tokens`` is refused as
``budget_exhausted``. After each turn and on hello the session's tabs get a ``budget`` frame with
what is left, which the meter shows. Sessions nobody owns (modes ``none`` and ``token``) are not
limited here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from server.config.settings import AuthSettings
from server.errors import BudgetExhausted, Busy
from server.protocol import server_frame
from server.sessions.channel import Frame
from server.sessions.session import Session
from server.store.base import Store


def day_bounds(now: datetime | None = None) -> tuple[str, str]:
    """The start of today and of tomorrow (UTC), as the store's timestamps spell them."""
    now = now or datetime.now(UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return (start.isoformat(timespec="microseconds"),
            (start + timedelta(days=1)).isoformat(timespec="microseconds"))


class Quota:
    def __init__(self, auth: AuthSettings, store: Store) -> None:
        self.turns = auth.user_turns
        self.daily = auth.daily_tokens
        self.store = store

    def check_turns(self, owner: str, sessions: Iterable[Session]) -> None:
        running = sum(1 for session in sessions if session.owner == owner and session.turn is not None)
        if running >= self.turns:
            raise Busy(f"you have {running} replies being written at once, the most allowed "
                       f"([auth] user_turns); wait for one to finish")

    async def left(self, owner: str) -> int | None:
        """Tokens ``owner`` may still spend today; None when there is no daily budget."""
        if not self.daily:
            return None
        spent = await self.store.tokens_since(owner, day_bounds()[0])
        return max(0, self.daily - spent)

    async def check_budget(self, owner: str) -> None:
        left = await self.left(owner)
        if left == 0:
            raise BudgetExhausted(f"you have used your {self.daily:,} tokens for today; the budget "
                                  f"starts again at {day_bounds()[1][:16].replace('T', ' ')} UTC")

    async def frame(self, owner: str | None) -> Frame | None:
        """The ``budget`` frame for ``owner``'s tabs, or None (nobody owns it, or no budget)."""
        left = await self.left(owner) if owner is not None else None
        if left is None:
            return None
        return server_frame("budget", tokens_left=left, daily_tokens=self.daily, resets_at=day_bounds()[1])
