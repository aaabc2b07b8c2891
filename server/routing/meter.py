"""The context meter: one accounting of "how full" for the route that serves (or will serve) a call.

Every figure the user sees about the prompt's size comes from one ``Reading``: the meter's
``estimated_tokens``, the trim notices' ``tokens_before``/``tokens_after``, the trim budget and the
capacity check. A reading holds the raw estimate of the next request (system prompt, history, images,
tool schemas; ``server.history.messages``'s bytes/4 heuristic) and turns it into the route's count:

- anchored: when the provider counted an earlier request of this session on this route, the figure
  is that count plus the calibrated estimate of everything added (or dropped) since:
  ``reported + ceil(ratio * (raw - raw_then))``. The reply to that request is counted too: the
  provider said how many tokens it wrote (``completion_tokens``, ``output_tokens``, ``eval_count``),
  so the anchor moves past it (``Anchor.with_reply``) and only what was added after the reply (the
  next message, tool results) is estimated. One ratio cannot price code replies and prose questions
  alike; a reply counted by its writer needs no ratio.
  What is added after the reply is priced by its kind of content (``routing.content``: prose,
  JSON, dense text such as code, CJK script, images): one conversation's prose question and a tool's
  JSON result cost very different tokens per byte. Each step between two counts teaches the ratio of
  the kind that made it (the difference of the counts, the reply's own count taken off, over the
  step's estimate), on the session's anchor and for the route (``KindRatios``), so a kind counted
  once, in any session on the route, is priced at its own ratio from then on. A kind never counted
  on the route is priced by its pieces: the tokens a piece cost in the last counted reply times the
  pieces per raw token the new content holds (``content.piece_density``); with no counted reply
  yet, or images, at the session's marginal ratio.
  What a trim takes off is priced at the anchored request's average (``Anchor.whole``: old turns of
  every kind), and the trim moves the session's anchors past it (``Anchor.without``).
- otherwise: ``ceil(ratio * raw)`` with the route's calibration ratio (1.0 until a report).

The reply reserve (``runtime.reply_reserve_tokens``) is added on top: a request must leave that much
room for the answer. ``raw_history_budget`` is the inverse, so the ledger trims (in raw units, tool
schemas left out) to exactly what the figure allows. ``model_context_window`` is left out when the
capacity is unknown: the 32,000 compatibility fallback is never presented as a model's window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from server.config.settings import ProviderProfile
from server.history.ledger import HistoryLedger
from server.history.messages import DEFAULT_IMAGE_TOKEN_COST, MESSAGE_OVERHEAD_TOKENS, ChatMessage
from server.protocol import server_frame
from server.providers.base import ToolSpec, Usage
from server.routing.content import Density, added, kind_of, piece_density, tokens_per_piece
from server.routing.resolver import Capacity, Route, RouteResolver
from server.tools.toolbox import Toolbox


def tool_schema_tokens(tools: Sequence[ToolSpec]) -> int:
    if not tools:
        return 0
    size = len(json.dumps([[t.name, t.description, t.parameters] for t in tools]).encode("utf-8"))
    return -(-size // 4)


def tokens_by_server(toolbox: Toolbox, tools: Sequence[ToolSpec]) -> tuple[tuple[str, int], ...]:
    """The schema tokens of ``tools`` per server that offers them (the meter's tools segment split)."""
    specs: dict[str, list[ToolSpec]] = {}
    for spec in tools:
        tool = toolbox.find(spec.name)
        specs.setdefault(tool.server if tool is not None else "other", []).append(spec)
    return tuple((server, tool_schema_tokens(group)) for server, group in specs.items())


MIN_MARGINAL_RAW = 32  # a smaller step between two counts says too little about the ratio
RATIO_MIN, RATIO_MAX = 0.25, 4.0
PER_PIECE = "per piece"  # the ``KindRatios`` entry of a route's tokens per piece (``content``)
DIGITS = "digits"  # and of how its vocabulary cuts numbers (``Anchor.digits``)


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
    per_piece: float | None = None  # tokens per piece (``content.piece_density``) of the last counted reply
    digits: int = 3  # how the provider's vocabulary cuts numbers, as its counted replies told

    @property
    def step(self) -> float | None:
        """What a raw token added after the anchor costs, as far as this session knows."""
        return self.ratio or self.base

    @property
    def whole(self) -> float:
        """What a raw token of the counted request cost on average: the price of history a trim
        drops (old turns of every kind, not the kind just added)."""
        return min(RATIO_MAX, max(RATIO_MIN, self.reported / self.raw)) if self.raw > 0 else 1.0

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

    def with_reply(self, raw: int, tokens: int, kind: str | None = None,
                   density: Density | None = None) -> Anchor:
        """The anchor moved past a reply estimated at ``raw`` that the provider counted ``tokens``
        (its per-message overhead, which no output count holds, priced at the marginal ratio). A
        reply of ``kind`` teaches that kind's ratio too, and, with its pieces per raw token
        (``density``), the tokens a piece costs: what prices a kind never counted yet."""
        overhead = math.ceil((self.step or 1.0) * MESSAGE_OVERHEAD_TOKENS)
        text = raw - MESSAGE_OVERHEAD_TOKENS  # the reply's text and tool calls: what ``tokens`` counts
        if text < MIN_MARGINAL_RAW:
            return self.moved(self.raw + raw, self.reported + tokens + overhead, counted=False)
        base = min(RATIO_MAX, max(RATIO_MIN, tokens / text))
        per_piece, digits = (self.per_piece, self.digits) if density is None \
            else tokens_per_piece(tokens, text, density, self.digits)
        return self.moved(self.raw + raw, self.reported + tokens + overhead, counted=False, base=base,
                          kinds=self.with_kind(kind, base), per_piece=per_piece, digits=digits)

    def with_kind(self, kind: str | None, ratio: float) -> tuple[tuple[str, float], ...]:
        """``kinds`` with ``kind`` at ``ratio``: the newest sample of a kind replaces the older (a
        session's content drifts within a kind)."""
        if kind is None:
            return self.kinds
        return tuple((k, r) for k, r in self.kinds if k != kind) + ((kind, ratio),)

    def then(self, raw: int, reported: int, kind: str | None = None) -> Anchor:
        """The anchor after the provider counted ``reported`` for a request estimated at ``raw``,
        whose part added since this anchor was of ``kind``. That kind's ratio is learned only when
        the step holds nothing else: the anchor was moved past the reply by its count, or came from
        a count endpoint after it (a reply without a count would be in the step too)."""
        step = raw - self.raw
        if step < MIN_MARGINAL_RAW:
            return self.moved(raw, reported, counted=True)
        sample = min(RATIO_MAX, max(RATIO_MIN, (reported - self.reported) / step))
        ratio = sample if self.ratio is None else (sample + self.ratio) / 2
        alone = not self.counted or self.source == "provider_count"  # no uncounted reply in the step
        kinds = self.with_kind(kind if alone else None, sample)
        return self.moved(raw, reported, counted=True, ratio=ratio, kinds=kinds)


def next_anchor(previous: Anchor | None, raw: int, reported: int, kind: str | None = None) -> Anchor:
    if previous is not None:
        return previous.then(raw, reported, kind)
    return Anchor(raw, reported, base=min(RATIO_MAX, max(RATIO_MIN, reported / raw)) if raw > 0 else None)


def count_anchor(previous: Anchor | None, raw: int, tokens: int) -> Anchor:
    """The anchor on a count endpoint's figure for the request estimated at ``raw``: the ratios
    this session learned are kept (the count says nothing about the price of what comes next)."""
    fresh = next_anchor(None, raw, tokens)
    base = previous.base if previous is not None and previous.base else fresh.base
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


@dataclass(frozen=True)
class Reading:
    route: Route
    capacity: Capacity
    budget: int
    estimate: int  # raw estimate of the request, tool schemas included
    tools: int = 0  # raw tokens of the tool schemas (part of ``estimate``)
    ratio: float = 1.0
    anchor: Anchor | None = None
    reserve: int = 0
    tool_servers: tuple[tuple[str, int], ...] = ()  # ``tools`` per server offering them
    kind: str | None = None  # the kind of content added since the last reply (``content_kind``)
    route_kind_ratio: float | None = None  # that kind's ratio as the route learned it
    piece_ratio: float | None = None  # a kind never counted: tokens per piece x its pieces per raw token

    @property
    def step_ratio(self) -> float:
        """What a raw token added to the anchored request counts: the ratio of the added content's
        kind (the session's, else the route's), else its price by its pieces, else the session's
        step. What leaves the request is priced at ``drop_ratio``."""
        anchor = self.anchor
        if anchor is None:
            return self.ratio
        return (anchor.kind_ratio(self.kind) or self.route_kind_ratio or self.piece_ratio or anchor.step
                or self.ratio)

    @property
    def drop_ratio(self) -> float:
        """What a raw token taken off the request counts: the anchored request's average (a trim
        drops old turns of every kind), else the calibration."""
        return self.anchor.whole if self.anchor is not None else self.ratio

    def _now(self, anchor: Anchor) -> float:
        """The count of the request as it stands (``estimate``): what was added since the count at
        the step ratio, what left it (net) at the drop ratio."""
        delta = self.estimate - anchor.raw
        return anchor.reported + (self.step_ratio if delta >= 0 else anchor.whole) * delta

    def count(self, raw: int) -> int:
        """The route's count for a request whose raw estimate (tools included) is ``raw``: from the
        request as it stands, content added at the step ratio and content left out (a trim's
        result) at the drop ratio."""
        anchor = self.anchor
        if anchor is None:
            return max(0, math.ceil(self.ratio * raw))
        change = raw - self.estimate
        now = self._now(anchor)
        return max(0, math.ceil(now + (self.step_ratio if change >= 0 else anchor.whole) * change))

    def raw_for(self, figure: int) -> int:
        """The largest raw estimate (tools included) whose ``count`` stays within ``figure``."""
        anchor = self.anchor
        if anchor is None:
            return math.floor(figure / self.ratio)
        now = self._now(anchor)
        if figure >= now:
            return self.estimate + math.floor((figure - now) / self.step_ratio)
        return self.estimate - math.ceil((now - figure) / anchor.whole)

    @property
    def counted(self) -> bool:
        """The figure is the provider's own count: nothing was added since it counted."""
        anchor = self.anchor
        return anchor is not None and anchor.counted and anchor.raw == self.estimate and not self.reserve

    @property
    def figure(self) -> int:
        """What the meter shows: the next request's count plus the reply reserve."""
        return self.count(self.estimate) + self.reserve

    def history_figure(self, raw_history: int) -> int:
        """The figure for a history estimate (tools and reserve added), for trim notices."""
        return self.count(raw_history + self.tools) + self.reserve

    @property
    def target(self) -> int:
        """The figure trims aim at: the budget, never above the known window (0 = trimming off)."""
        if self.budget <= 0:
            return 0
        window = self.capacity.window
        return self.budget if window is None else min(self.budget, window)

    def raw_history_budget(self, figure: int | None = None) -> int:
        """The ledger's budget (raw history tokens, tools and reserve taken off) for ``figure``."""
        target = self.target if figure is None else figure
        if target <= 0:
            return 0
        return max(1, self.raw_for(target - self.reserve) - self.tools)

    def over_capacity(self) -> int:
        """Tokens by which the request exceeds the known window (0 when it fits or is unknown)."""
        if self.capacity.window is None:
            return 0
        return max(0, self.figure - self.capacity.window)


class Meter:
    def __init__(self, resolver: RouteResolver, providers: Mapping[str, ProviderProfile],
                 reserve: int = 0, toolbox: Toolbox | None = None,
                 image_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> None:
        self.resolver = resolver
        self.image_cost = image_cost
        self._providers = providers
        self.reserve = max(0, reserve)
        self.toolbox = toolbox or Toolbox({}, 0)
        self.kinds = KindRatios()

    def tools(self, route: Route, final: bool = False) -> list[ToolSpec]:
        """The tools offered on ``route``'s calls (the provider's ``tools`` selection of the servers
        ready now): none on the final call after the tool cap."""
        return [] if final else self.toolbox.specs(self._providers[route.provider])

    async def read(self, route: Route, estimate: int, tools: Sequence[ToolSpec],
                   anchor: Anchor | None = None, messages: Sequence[ChatMessage] = ()) -> Reading:
        """Capacity and budget of ``route`` with the estimate of what would be sent to it (the
        messages after the last reply in ``messages`` are what the anchor has not counted)."""
        capacity = await self.resolver.capacity(route)
        schemas, servers = self.toolbox.memo(tools, self.schema_sizes)
        new = added(messages)
        kind = kind_of(new)
        route_ratio = self.kinds.get(route.name, kind)
        calibration = self.resolver.calibration.ratio(route)
        pieces = None
        if anchor is not None and anchor.kind_ratio(kind) is None and route_ratio is None:
            pieces = self.piece_ratio(route.name, anchor, new, calibration)
        return Reading(route, capacity, self.resolver.budget(capacity), estimate + schemas, schemas,
                       calibration, anchor, self.reserve, servers, kind, route_ratio, pieces)

    def piece_ratio(self, route: str, anchor: Anchor, new: Sequence[ChatMessage],
                    calibration: float) -> float | None:
        """The price of content of a kind never counted on ``route``: its text at the tokens a piece
        cost in the session's last counted reply (else on the route) times the pieces per raw token
        it holds; its images (a configured guess, ``image_token_cost``, no text) at the route's
        whole-request ratio of count to estimate, the only scale learned with images in it."""
        per_piece, digits = anchor.per_piece, anchor.digits
        if per_piece is None:
            per_piece, digits = self.kinds.get(route, PER_PIECE), int(self.kinds.get(route, DIGITS) or 3)
        if per_piece is None:
            return None
        text = sum(message.text_tokens for message in new)
        images = self.image_cost * sum(len(message.images or ()) for message in new)
        density = piece_density([message.content for message in new])
        if density is None and not images:
            return None
        price = per_piece * density.of(digits) if density is not None else anchor.step or 1.0
        return min(RATIO_MAX, max(RATIO_MIN, (text * price + images * calibration) / (text + images)))

    def schema_sizes(self, tools: Sequence[ToolSpec]) -> tuple[int, tuple[tuple[str, int], ...]]:
        return tool_schema_tokens(tools), tokens_by_server(self.toolbox, tools)

    def frame(self, reading: Reading, ledger: HistoryLedger, reason: str, reported: int | None = None,
              trimmed: int = 0) -> dict[str, Any]:
        """The ``context`` frame; ``trimmed``: the raw tokens trims and compaction left out."""
        preview = self.preview(reading, ledger) if reported is None else None
        if reported is None:
            source = reading.anchor.source if reading.counted and reading.anchor else "estimate"
            tokens_used = reading.figure
        else:
            tokens_used, source = reported, "provider"
        return server_frame(
            "context", provider=reading.route.provider, model=reading.route.model,
            route_kind=reading.route.kind, estimated_tokens=tokens_used, tokens_source=source,
            context_token_budget=reading.budget, model_context_window=reading.capacity.window,
            window_source=reading.capacity.source, trim_preview=preview, reason=reason,
            **breakdown(reading, ledger, trimmed),
        )

    def preview(self, reading: Reading, ledger: HistoryLedger) -> dict[str, int] | None:
        """``{turns, tokens}`` the next send's budget trim would drop, in the figure's units."""
        if reading.target <= 0:
            return None
        turns, tokens = ledger.preview(reading.raw_history_budget())
        return {"turns": turns, "tokens": math.ceil(tokens * reading.drop_ratio)} if turns else None


def breakdown(reading: Reading, ledger: HistoryLedger, trimmed: int) -> dict[str, Any]:
    """The parts of the figure, each calibrated for the route (the anchor's correction is in none)."""
    text, system = ledger.text_tokens, ledger.system_tokens  # running sums: no walk per frame
    images = ledger.estimate - text  # the ledger's estimate is estimate_history_tokens of its messages

    def scaled(raw: int) -> int:
        return math.ceil(raw * reading.ratio)

    return {"system_tokens": scaled(system), "tool_schema_tokens": scaled(reading.tools),
            "history_tokens": scaled(ledger.estimate - system - images), "image_tokens": scaled(images),
            "trimmed_tokens": scaled(trimmed), "reply_reserve": reading.reserve,
            "calibration_ratio": round(reading.ratio, 3),
            "tool_servers": {server: scaled(tokens) for server, tokens in reading.tool_servers}}
