"""Per-route calibration of our token estimate against what the provider reports.

Our estimate (``server.history.messages``: UTF-8 bytes / 4 + 4 per message) is a heuristic; each provider's
tokenizer counts differently. After every call whose usage reports ``input_tokens`` we learn the
ratio ``reported / estimate`` for the provider/model route that served it, and ``apply`` scales a
fresh estimate by it.

Contract:
- The first observation sets the ratio outright (no prior to average with); later ones are an
  exponential moving average with weight ``alpha`` on the newest, so a tokenizer that is a fixed
  multiple of our estimate plus noise is matched within a few percent by the second call.
- Ratios are clamped to ``[RATIO_MIN, RATIO_MAX]``; observations with a non-positive estimate or
  count are ignored (a provider that reports 0 input tokens says nothing about its tokenizer).
- A route never observed has ratio 1, so ``apply`` returns the estimate unchanged.
- Routes are keyed by ``provider/model`` only: a hint or fallback call on the same pair shares it.
- ``ratio`` (what the meter reads) falls back, for a pair never observed, to the pair of the same
  provider alias observed last: after a switch to a sibling model the same server's tokenizer is a
  better first guess than 1. ``apply`` stays strictly per pair.
- At most ``limit`` routes are kept, the least recently observed forgotten first (a forgotten route
  starts again at ratio 1).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Protocol

RATIO_MIN = 0.25
RATIO_MAX = 4.0
DEFAULT_ALPHA = 0.5


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def bounded(ratio: float) -> float:
    """``ratio`` within ``[RATIO_MIN, RATIO_MAX]``: no one count moves an estimate further."""
    return min(RATIO_MAX, max(RATIO_MIN, ratio))


class Calibration:
    """The learned ratio of one route."""

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.ratio = 1.0
        self.observations = 0

    def observe(self, estimate: int, reported: int) -> None:
        if estimate <= 0 or reported <= 0:
            return
        sample = bounded(reported / estimate)
        if self.observations == 0:
            self.ratio = sample
        else:
            self.ratio = bounded(self.alpha * sample + (1.0 - self.alpha) * self.ratio)
        self.observations += 1

    def apply(self, estimate: int) -> int:
        if estimate <= 0 or self.observations == 0:
            return max(0, estimate)
        return math.ceil(estimate * self.ratio)


class Calibrations:
    """One ``Calibration`` per provider/model route, created on first observation."""

    def __init__(self, alpha: float = DEFAULT_ALPHA, limit: int = 512) -> None:
        self._alpha = alpha
        self._limit = max(1, limit)
        self._by_route: OrderedDict[str, Calibration] = OrderedDict()
        self._last_of_provider: dict[str, Calibration] = {}  # keyed by configured aliases only

    def observe(self, route: _Named | str, estimate: int, reported: int) -> None:
        key = _key(route)
        calibration = self._by_route.get(key)
        if calibration is None:
            calibration = self._by_route[key] = Calibration(self._alpha)
        self._by_route.move_to_end(key)
        while len(self._by_route) > self._limit:
            self._by_route.popitem(last=False)
        calibration.observe(estimate, reported)
        self._last_of_provider[key.partition("/")[0]] = calibration

    def __len__(self) -> int:
        return len(self._by_route)

    def apply(self, route: _Named | str, estimate: int) -> int:
        calibration = self._by_route.get(_key(route))
        return max(0, estimate) if calibration is None else calibration.apply(estimate)

    def ratio(self, route: _Named | str) -> float:
        """The route's learned ratio; 1.0 for a route never observed."""
        key = _key(route)
        calibration = self._by_route.get(key) or self._last_of_provider.get(key.partition("/")[0])
        return 1.0 if calibration is None or calibration.observations == 0 else calibration.ratio


def plausible(estimate: int, reported: int) -> bool:
    """Whether a count can be about that estimate at all (its ratio inside the clamp): an overflow
    error's count from a provider whose tokenizer is nothing like ours is not used."""
    return estimate > 0 and reported > 0 and RATIO_MIN <= reported / estimate <= RATIO_MAX


def named_window(limit: int, max_tokens: int | None) -> int:
    """The window an overflow error named, checked against the request's ``max_tokens``. A limit
    that cannot hold even the reply asked for is the window less ``max_tokens`` (vLLM 0.15 rc said
    "maximum context length is 3 tokens" of a 2048 window with max_tokens 2045, vllm#33418); any
    larger limit is taken as said (too low by max_tokens at worst: trims come early, never late)."""
    if max_tokens and 0 < limit <= max_tokens:
        return limit + max_tokens
    return limit


def _key(route: _Named | str) -> str:
    return route if isinstance(route, str) else route.name
