"""``ReplyBudget``: how much of one reply a provider may still stream.

Every character a reply accumulates counts against ``ReplyLimits.chars``: text and thinking deltas as
they are yielded (the turn keeps them, the frame log carries them), tool-call argument fragments as
the dialect joins them (before any event leaves), and each tool call's name and id with a fixed
``CALL_COST`` for the bookkeeping a call costs (each Anthropic content block too), so an endless run
of empty calls or blocks is bounded as well. One
call's arguments are bounded on their own by ``ReplyLimits.tool_argument_chars``. Past either bound
``ReplyTooLarge`` is raised inside the dialect's read loop: the response is closed unread (the
connection dropped) and the turn keeps the text so far, marked interrupted.
"""

from __future__ import annotations

from server.errors import ReplyTooLarge
from server.providers.base import ReplyLimits

# A call's own cost in characters: its id, name and objects weigh about this much beyond the text.
CALL_COST = 256


class ReplyBudget:
    def __init__(self, alias: str, limits: ReplyLimits) -> None:
        self.alias = alias
        self.limits = limits
        self.used = 0

    def take(self, size: int) -> None:
        """Count ``size`` more characters of the reply; raises once the reply is past its bound."""
        self.used += size
        if self.used > self.limits.chars:
            raise ReplyTooLarge(
                f"{self.alias}: the reply grew past {self.limits.chars:,} characters "
                f"(runtime.max_reply_chars); the call was ended and the text so far kept")

    def call(self, name: str, call_id: str = "") -> None:
        """A new tool call begins: its name, id and bookkeeping count against the reply."""
        self.take(CALL_COST + len(name) + len(call_id))

    def arguments(self, name: str, size: int, added: int) -> None:
        """``added`` characters of a call's arguments came, ``size`` in all so far."""
        if size > self.limits.tool_argument_chars:
            raise ReplyTooLarge(
                f"{self.alias}: the arguments of tool call {name!r} grew past "
                f"{self.limits.tool_argument_chars:,} characters (runtime.max_tool_argument_chars); "
                f"the call was ended")
        self.take(added)
