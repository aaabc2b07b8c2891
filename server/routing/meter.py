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
from dataclasses import dataclass
from typing import Any

from server.config.settings import ProviderProfile
from server.history.ledger import HistoryLedger
from server.history.messages import DEFAULT_IMAGE_TOKEN_COST, ChatMessage
from server.protocol import server_frame
from server.providers.base import ToolSpec
from server.routing.anchor import MIN_MARGINAL_RAW, Anchor, next_anchor, reply_text
from server.routing.calibration import bounded
from server.routing.content import (
    Density,
    Vocabulary,
    added,
    content_kind,
    kind_of,
    message_density,
    message_kind,
    piece_costs,
    piece_density,
)
from server.routing.learned import IMAGE, PREAMBLE, KindRatios, Opening
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
    density: Density | None = None  # of the text added since the last reply, while the route learns
    added: int = 0  # the messages added since the last reply
    preamble: int = 0  # raw tokens of the system prompt and the tool schemas
    images: int = 0  # raw tokens of the images in the first message, while no anchor
    opening: Opening | None = None  # no anchor yet: the first request's two parts, when the route knows

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
            return max(0, math.ceil(self.opening.count(raw) if self.opening else self.ratio * raw))
        change = raw - self.estimate
        now = self._now(anchor)
        return max(0, math.ceil(now + (self.step_ratio if change >= 0 else anchor.whole) * change))

    def raw_for(self, figure: int) -> int:
        """The largest raw estimate (tools included) whose ``count`` stays within ``figure``."""
        anchor = self.anchor
        if anchor is None:
            return self.opening.raw_for(figure) if self.opening else math.floor(figure / self.ratio)
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
        self.vocabularies: dict[str, Vocabulary] = {}  # route name -> how its vocabulary cuts text

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
        if anchor is None:
            return self.opening_read(route, capacity, estimate + schemas, schemas, servers, messages)
        new = added(messages)
        kind = kind_of(new)
        route_ratio = self.kinds.get(route.name, kind)
        calibration = self.resolver.calibration.ratio(route)
        vocabulary = self.vocabulary(route.name)
        unpriced = anchor.kind_ratio(kind) is None and route_ratio is None
        # Read the pieces only to price an unknown kind or to learn one the route has no sample of.
        density = piece_density([message.content for message in new]) \
            if unpriced or not vocabulary.knows(kind) else None
        pieces = self.piece_ratio(route.name, vocabulary, anchor, new, density) if unpriced else None
        return Reading(route, capacity, self.resolver.budget(capacity), estimate + schemas, schemas,
                       calibration, anchor, self.reserve, servers, kind, route_ratio, pieces, density,
                       len(new))

    def opening_read(self, route: Route, capacity: Capacity, estimate: int, schemas: int,
                     servers: tuple[tuple[str, int], ...], messages: Sequence[ChatMessage]) -> Reading:
        """The reading of a request to ``route`` with no count of this session's on it. A session's
        first message: its preamble at the route's ``PREAMBLE`` ratio when earlier sessions taught
        it, the message by its pieces (``Opening``), read while the route has counted text, to price
        it and to learn the preamble from the count (``counted``). A conversation switched to the
        route: the route's calibration, a whole-request ratio of the same mix (``preamble`` left 0:
        its count teaches no preamble)."""
        calibration = self.resolver.calibration.ratio(route)
        kind = content_kind(messages)
        first = [message for message in messages if message.role != "system"]
        if any(message.role == "assistant" for message in first):  # a conversation switched here
            return Reading(route, capacity, self.resolver.budget(capacity), estimate, schemas, calibration,
                           None, self.reserve, servers, kind)
        preamble = schemas + sum(message.text_tokens for message in messages if message.role == "system")
        latest = self.vocabulary(route.name).latest
        density = piece_density([message.content for message in first]) if latest is not None else None
        learned = self.kinds.get(route.name, PREAMBLE)
        images = self.image_cost * sum(len(message.images or ()) for message in first)
        opening = None
        if learned is not None:
            text = sum(message.text_tokens for message in first)
            price = self.first_price(route.name, density) or calibration
            picture = self.kinds.get(route.name, IMAGE) or calibration
            rest = (text * price + images * picture) / (text + images) if text + images else calibration
            opening = Opening(preamble, learned, rest)
        return Reading(route, capacity, self.resolver.budget(capacity), estimate, schemas, calibration,
                       None, self.reserve, servers, kind, density=density,
                       added=len(first), preamble=preamble, images=images, opening=opening)

    def first_price(self, route: str, density: Density | None) -> float | None:
        """What a raw token of text of ``density`` costs on ``route`` by its pieces, at the route's
        latest counted text's cost a piece."""
        vocabulary = self.vocabulary(route)
        latest = vocabulary.latest
        if density is None or latest is None:
            return None
        return bounded(latest[vocabulary.cut] * density.of(vocabulary.cut))

    def vocabulary(self, route: str) -> Vocabulary:
        return self.vocabularies.get(route) or Vocabulary()

    def piece_ratio(self, route: str, vocabulary: Vocabulary, anchor: Anchor, new: Sequence[ChatMessage],
                    density: Density | None) -> float | None:
        """The price of content of a kind never counted on the route: its text at what a piece cost
        in the session's last counted reply (else the route's latest counted text), under the cut
        the route's vocabulary makes, times the pieces per raw token it holds (``density``); its
        images (a configured guess, ``image_token_cost``, no text) at what the route's first counts
        taught them to cost (``IMAGE``), else at the anchored request's ratio of count to estimate
        (``Anchor.whole``): this session's own scale, with its images in it when it had any, where
        the route's calibration mixes every session's content."""
        costs = anchor.costs or vocabulary.latest
        images = self.image_cost * sum(len(message.images or ()) for message in new)
        if costs is None or (density is None and not images):
            return None
        text = sum(message.text_tokens for message in new)
        cut = vocabulary.cut
        price = costs[cut] * density.of(cut) if density is not None else anchor.step or 1.0
        picture = self.kinds.get(route, IMAGE) or anchor.whole
        return bounded((text * price + images * picture) / (text + images))

    def counted(self, anchors: dict[str, Anchor], reading: Reading, reported: int) -> None:
        """The provider counted ``reported`` for the request ``reading`` measured: the session's
        anchor on the route moves, and what the step taught becomes the route's: its kind's ratio
        (the next session's first content of that kind is priced by it) and what its pieces cost."""
        route, kind = reading.route.name, reading.kind
        before = anchors.get(route)
        if before is None:
            self.learn_preamble(reading, reported)
        anchor = anchors[route] = next_anchor(before, reading.estimate, reported, kind)
        learned = anchor.kind_ratio(kind)
        if kind is not None and learned is not None:
            self.kinds.learn(route, kind, learned)
        step = before.step_text(reading.estimate, reported, reading.added) if before is not None else None
        if step is not None and kind is not None and reading.density is not None \
                and not kind.endswith("/image"):
            self.learn_pieces(route, kind, piece_costs(*step, reading.density), reading.density)

    def replied(self, anchors: dict[str, Anchor], route: str, message: ChatMessage, tokens: int) -> None:
        """The provider wrote ``message`` in ``tokens`` tokens: the session's anchor moves past it,
        and the reply's kind ratio and piece costs become the route's."""
        anchor = anchors.get(route)
        if anchor is None or not anchor.counted:
            return
        kind = None if message.tool_calls else message_kind(message)  # a call's JSON is too short
        density = None if message.tool_calls else message_density(message)
        moved = anchors[route] = anchor.with_reply(message.text_tokens, tokens, kind, density)
        learned = moved.kind_ratio(kind)
        if kind is not None and learned is not None:
            self.kinds.learn(route, kind, learned)
        if kind is not None and density is not None and moved.costs is not None \
                and reply_text(message.text_tokens) is not None:
            self.learn_pieces(route, kind, moved.costs, density)

    def learn_preamble(self, reading: Reading, reported: int) -> None:
        """A session's first count on a route teaches the route what its preamble (system prompt and
        tool schemas) costs: the count less the first message priced by its pieces. Every later
        session's first figure on the route then prices its preamble at that ratio (``Opening``).
        With images in the first message, the preamble already learned, the rest is what the images
        cost (``IMAGE``): their configured estimate is only a guess."""
        route = reading.route.name
        if self.vocabulary(route).latest is None or reading.preamble < MIN_MARGINAL_RAW:
            return  # nothing counted on the route prices the message yet, or not a first message
        # A text too short to read its pieces (a caption) is too short to matter: the calibration.
        price = self.first_price(route, reading.density) or reading.ratio
        rest = reported - price * (reading.estimate - reading.preamble - reading.images)
        if not reading.images:
            if rest > 0:
                self.kinds.learn(route, PREAMBLE, bounded(rest / reading.preamble))
            return
        learned = self.kinds.get(route, PREAMBLE)
        pictures = rest - learned * reading.preamble if learned is not None else 0
        if pictures > 0:
            self.kinds.learn(route, IMAGE, bounded(pictures / reading.images))

    def opened(self, route: str, raw: int, tokens: int) -> None:
        """A count endpoint counted a request holding only the preamble: its ratio, exactly."""
        if raw >= MIN_MARGINAL_RAW:
            self.kinds.learn(route, PREAMBLE, bounded(tokens / raw))

    def learn_pieces(self, route: str, kind: str, costs: tuple[float, ...], density: Density) -> None:
        self.vocabularies[route] = self.vocabulary(route).learned(kind, costs, density)

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
