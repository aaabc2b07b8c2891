"""DESIGN contract name ``server.history_trim``: whole-turn trimming lives in ``server.history.trim``."""

from __future__ import annotations

from server.history.trim import TrimReport, trim_to_recent_turn_count, trim_to_recent_turns

__all__ = ["TrimReport", "trim_to_recent_turn_count", "trim_to_recent_turns"]
