"""A session's anchor on a route: the provider's last count of its request, and what the counts taught.

The meter (``server/routing/meter.py``) reads the next request as the anchor's count plus the price
of what changed since. An anchor moves three ways:

- ``then``: the provider counted a request (its usage, an overflow naming the count). The step
  between two counts teaches the marginal ratio, and, when the step holds only content added after
  a counted reply, the ratio of that content's kind (``routing.content``);
- ``with_reply``: the provider said how many tokens it wrote, so the anchor moves past the reply by
  that count; the reply teaches its kind's ratio and what a piece cost in it (``costs``);
- ``without``: a trim left content out, priced at the anchored request's average (``whole``).

``count_anchor`` puts one on a count endpoint's figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from server.history.messages import MESSAGE_OVERHEAD_TOKENS
from server.providers.base import Usage
from server.routing.calibration import bounded
from server.routing.content import Density, piece_costs

MIN_MARGINAL_RAW = 32  # a smaller step between two counts says too little about the ratio


@dataclass(frozen=True)
class Anchor:
    """What the provider counted for one request: ``reported`` tokens where we estimated ``raw``;
    ``ratio``, when known, is the marginal ratio between this session's successive counts (what the
    tokens added since cost), which the pieces a conversation adds match better than a whole-request
    ratio pulled by the system prompt and the tool schemas."""

    raw: int
    reported: int
    ratio: float | None = None
    counted: bool = True  # ``reported`` is one count of the provider's (not count + reply)
    # The step's price until a marginal ratio is learned: this session's last counted reply's ratio,
    # else its first whole-request ratio (the route's calibration mixes every session's content, and
    # a whole request's ratio is pulled by the tool schemas).
    base: float | None = None
    source: str = "provider"  # the meter's tokens_source while nothing was added since the count
    kinds: tuple[tuple[str, float], ...] = ()  # the marginal ratio of each kind of content learned
    # What a piece cost under each cut (``content.Density``) in this session's last counted reply.
    costs: tuple[float, ...] | None = None

    @property
    def step(self) -> float | None:
        """What a raw token added after the anchor costs, as far as this session knows."""
        return self.ratio or self.base

    @property
    def whole(self) -> float:
        """What a raw token of the counted request cost on average: the price of history a trim
        drops (old turns of every kind, not the kind just added)."""
        return bounded(self.reported / self.raw) if self.raw > 0 else 1.0

    @property
    def alone(self) -> bool:
        """The next step between counts holds only what is added from now on: no reply the
        provider did not count (the anchor moved past it, or came from a count endpoint after it)."""
        return not self.counted or self.source == "provider_count"

    def without(self, raw: int) -> Anchor:
        """The anchor with ``raw`` estimated tokens of its request left out by a trim, priced at
        ``whole``: the next step then holds only what was added since the count."""
        dropped = min(self.raw, max(0, raw))
        return self.moved(self.raw - dropped, max(0, self.reported - math.ceil(self.whole * dropped)),
                          counted=False)

    def moved(self, raw: int, reported: int, **learned: Any) -> Anchor:
        """This anchor at another count, with what the session learned kept unless ``learned``
        replaces it; ``source`` is the provider's again."""
        return replace(self, raw=raw, reported=reported, source="provider", **learned)

    def kind_ratio(self, kind: str | None) -> float | None:
        return dict(self.kinds).get(kind) if kind else None

    def overhead(self, messages: int) -> int:
        """The tokens of ``messages`` messages' framing, which no output count holds, at the step."""
        return math.ceil((self.step or 1.0) * MESSAGE_OVERHEAD_TOKENS * messages)

    def with_reply(self, raw: int, tokens: int, kind: str | None = None,
                   density: Density | None = None) -> Anchor:
        """The anchor moved past a reply estimated at ``raw`` that the provider counted ``tokens``
        (its per-message overhead priced at the marginal ratio). A reply of ``kind`` teaches that
        kind's ratio too, and, with its pieces per raw token (``density``), what a piece costs:
        what prices a kind never counted yet."""
        overhead = self.overhead(1)
        text = reply_text(raw)
        if text is None:
            return self.moved(self.raw + raw, self.reported + tokens + overhead, counted=False)
        base = bounded(tokens / text)
        costs = self.costs if density is None else piece_costs(tokens, text, density)
        return self.moved(self.raw + raw, self.reported + tokens + overhead, counted=False, base=base,
                          kinds=self.with_kind(kind, base), costs=costs)

    def with_kind(self, kind: str | None, ratio: float) -> tuple[tuple[str, float], ...]:
        """``kinds`` with ``kind`` at ``ratio``: the newest sample of a kind replaces the older (a
        session's content drifts within a kind)."""
        if kind is None:
            return self.kinds
        return tuple((k, r) for k, r in self.kinds if k != kind) + ((kind, ratio),)

    def then(self, raw: int, reported: int, kind: str | None = None) -> Anchor:
        """The anchor after the provider counted ``reported`` for a request estimated at ``raw``,
        whose part added since this anchor was of ``kind``. That kind's ratio is learned only when
        the step holds nothing else (``alone``)."""
        step = raw - self.raw
        if step < MIN_MARGINAL_RAW:
            return self.moved(raw, reported, counted=True)
        sample = bounded((reported - self.reported) / step)
        ratio = sample if self.ratio is None else (sample + self.ratio) / 2
        kinds = self.with_kind(kind if self.alone else None, sample)
        return self.moved(raw, reported, counted=True, ratio=ratio, kinds=kinds)

    def step_text(self, raw: int, reported: int, messages: int) -> tuple[int, int] | None:
        """The tokens and raw estimate of the text of ``messages`` messages added since this anchor,
        when the provider counted ``reported`` for the request estimated at ``raw`` and the step
        holds nothing else (``alone``); None when it holds too little to say."""
        # A message's framing is a few tokens whatever the ratio (3 or 4 in the chat templates).
        text = raw - self.raw - MESSAGE_OVERHEAD_TOKENS * messages
        tokens = reported - self.reported - MESSAGE_OVERHEAD_TOKENS * messages
        if not self.alone or text < MIN_MARGINAL_RAW or tokens <= 0:
            return None
        return tokens, text


def reply_text(raw: int) -> int | None:
    """The estimate of a reply's text and tool calls (what its output count counts) when it holds
    enough to price by: a reply of ``raw`` estimated tokens, less the message's framing."""
    text = raw - MESSAGE_OVERHEAD_TOKENS
    return text if text >= MIN_MARGINAL_RAW else None


def next_anchor(previous: Anchor | None, raw: int, reported: int, kind: str | None = None) -> Anchor:
    if previous is not None:
        return previous.then(raw, reported, kind)
    return Anchor(raw, reported, base=bounded(reported / raw) if raw > 0 else None)


def count_anchor(previous: Anchor | None, raw: int, tokens: int, conversation: bool = True) -> Anchor:
    """The anchor on a count endpoint's figure for the request estimated at ``raw``: the ratios
    this session learned are kept (the count says nothing about the price of what comes next). The
    count's own ratio prices what comes next only when the request held a ``conversation``: the
    system prompt and the tool schemas alone (a session just opened) say nothing of a message's."""
    base = previous.base if previous is not None and previous.base else None
    if base is None and conversation and raw > 0:
        base = bounded(tokens / raw)
    if previous is None:
        return Anchor(raw, tokens, base=base, source="provider_count")
    return replace(previous, raw=raw, reported=tokens, counted=True, base=base, source="provider_count")


def reply_tokens(usage: Usage, thinking: bool) -> int | None:
    """The tokens a reply occupies when it is sent back, from the provider's output count; None when
    that count cannot say: none given, or reasoning (never sent back) inside it by an unknown amount."""
    if usage.output_tokens <= 0:
        return None
    if usage.reasoning_tokens is not None:
        return max(0, usage.output_tokens - usage.reasoning_tokens)
    return None if thinking else usage.output_tokens
