"""What a route's counts taught the meter, across its sessions (routes come from the configuration,
so this stays small): the marginal ratio of each kind of content (``KindRatios``), among them the
preamble's (system prompt and tool schemas, ``PREAMBLE``) and the images' (``IMAGE``), and the
two-part price of a session's first request they make (``Opening``). How a route's vocabulary cuts
text is ``content.Vocabulary``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PREAMBLE = "preamble"  # the ``KindRatios`` entry of a route's system prompt and tool schemas (``Opening``)
IMAGE = "image"  # and of what its images cost a raw token of their configured estimate


class KindRatios:
    """The marginal ratio of each kind of content per route, as any session on it last learned it
    (routes come from the configuration, so this stays small)."""

    def __init__(self) -> None:
        self._by_route: dict[str, dict[str, float]] = {}

    def learn(self, route: str, kind: str, ratio: float) -> None:
        self._by_route.setdefault(route, {})[kind] = ratio

    def get(self, route: str, kind: str | None) -> float | None:
        return self._by_route.get(route, {}).get(kind) if kind else None


@dataclass(frozen=True)
class Opening:
    """A session's first request on a route, before any count of its own, priced in two parts: the
    preamble (system prompt and tool schemas, ``raw`` estimated tokens) at the ratio the route's
    earlier sessions' first counts taught (``PREAMBLE``), and the rest (the first message) at
    ``rest``, its price by its pieces where the route has counted text, else the calibration."""

    raw: int
    ratio: float
    rest: float

    def count(self, raw: int) -> float:
        preamble = min(raw, self.raw)
        return self.ratio * preamble + self.rest * (raw - preamble)

    def raw_for(self, figure: int) -> int:
        if figure <= self.ratio * self.raw:
            return math.floor(figure / self.ratio)
        return self.raw + math.floor((figure - self.ratio * self.raw) / self.rest)
