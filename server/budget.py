"""DESIGN contract name ``server.budget``: the budget lives in ``server.history.budget``."""

from __future__ import annotations

from server.history.budget import effective_context_budget

__all__ = ["effective_context_budget"]
