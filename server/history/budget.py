"""The effective context budget: the proactive trimming target for one provider/model route.

``effective_context_budget(runtime, capacity)`` resolves, in order:

1. An explicit ``max_context_tokens == 0`` returns 0: proactive trimming is off.
2. A ``context_compact_ratio`` outside (0, 1] (or NaN) counts as unset; ``None`` means unset.
3. Window operand: the route's known capacity (> 0), else a positive ``max_context_tokens``, else
   ``FALLBACK_WINDOW``. The fallback is a compatibility stub for the arithmetic, never a model fact.
4. With a ratio: ``max(1, floor(window * ratio))``, capped by a positive ``max_context_tokens``.
   Without one: a positive ``max_context_tokens``, else ``FALLBACK_WINDOW``.
5. ``history_pruning`` (enabled, ``max_tokens > 0``) lowers the budget, never raises it.
6. A known capacity caps every positive budget.

The budget is a target for dropping old turns, not a hard request limit: the capacity check on the
prepared request is the caller's job.
"""

from __future__ import annotations

import math

from server.config.settings import RuntimeSettings

FALLBACK_WINDOW = 32_000


def _ratio(runtime: RuntimeSettings) -> float | None:
    ratio = runtime.context_compact_ratio
    if ratio is None or not 0.0 < ratio <= 1.0:  # NaN fails both comparisons: unset too
        return None
    return ratio


def _positive(value: int | None) -> int | None:
    return value if value is not None and value > 0 else None


def _base_budget(runtime: RuntimeSettings, known: int | None) -> int:
    explicit = _positive(runtime.max_context_tokens)
    ratio = _ratio(runtime)
    if ratio is None:
        return explicit or FALLBACK_WINDOW
    window = known or explicit or FALLBACK_WINDOW
    base = max(1, math.floor(window * ratio))
    return min(base, explicit) if explicit else base


def effective_context_budget(runtime: RuntimeSettings, capacity: int | None) -> int:
    """Token budget for proactive trimming on a route whose capacity is ``capacity`` (None = unknown)."""
    if runtime.max_context_tokens == 0:
        return 0
    known = _positive(capacity)
    budget = _base_budget(runtime, known)
    pruning = runtime.history_pruning
    if pruning.enabled and pruning.max_tokens > 0:
        budget = min(budget, pruning.max_tokens)
    return min(budget, known) if known else budget
