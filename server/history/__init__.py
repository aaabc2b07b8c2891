"""The pure history engine: messages and their estimate, whole-turn trimming, the running ledger,
the budget and the group-compaction planner. No I/O, no clock, no globals.

``server.history.ChatMessage`` and ``server.history.estimate_history_tokens`` are DESIGN contract
names: they stay importable from the package.
"""

from __future__ import annotations

from server.history.messages import (
    BREADCRUMB_TEXT,
    ChatMessage,
    Image,
    ToolCall,
    estimate_history_tokens,
)

__all__ = ["BREADCRUMB_TEXT", "ChatMessage", "Image", "ToolCall", "estimate_history_tokens"]
