"""What a turn's provider calls reported: ``Totals``, the sums its ``done`` frame carries, and
``silently_truncated``, the only trace of a prompt Ollama cut to fit its ``num_ctx``."""

from __future__ import annotations

from dataclasses import dataclass

from server.providers.base import Usage

TRUNCATION_RATIO = 0.6  # a prompt count below 60% of the (calibrated) estimate means a cut
TRUNCATION_MIN_TOKENS = 512


@dataclass
class Totals:
    input_tokens: int = 0
    output_tokens: int = 0
    last_input_tokens: int = 0
    cost_usd: float | None = None
    calls: int = 0  # provider calls whose usage the sums hold

    def add(self, usage: Usage, cost: float | None) -> None:
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.last_input_tokens = usage.input_tokens
        self.calls += 1
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost


def silently_truncated(provider_kind: str, expected: int, reported: int) -> bool:
    """Ollama answers an over-long prompt with HTTP 200 after dropping its start; the only trace is
    a prompt count far below the ``expected`` (calibrated) estimate of what was sent."""
    if provider_kind != "ollama":
        return False
    return expected >= TRUNCATION_MIN_TOKENS and reported < expected * TRUNCATION_RATIO
