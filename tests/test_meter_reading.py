"""``Reading``, the one accounting (pure): the figure, its inverse for the trim budget, the anchor."""

from __future__ import annotations

import pytest

from server.history.ledger import HistoryLedger
from server.history.messages import ChatMessage, Image, estimate_history_tokens
from server.routing.anchor import Anchor, count_anchor, next_anchor
from server.routing.meter import Reading, breakdown
from server.routing.resolver import Capacity, Route

ROUTE = Route("p", "m", "default")
KNOWN = Capacity(4096, "config")


def reading(estimate: int = 1000, *, capacity: Capacity = KNOWN, ratio: float = 1.0,
            anchor: Anchor | None = None, reserve: int = 0) -> Reading:
    return Reading(ROUTE, capacity, 4096, estimate, 100, ratio, anchor, reserve)


@pytest.mark.parametrize("anchor", [None, Anchor(900, 1200), Anchor(900, 1200, 1.1)])
@pytest.mark.parametrize("ratio", [0.8, 1.0, 1.37])
def test_reading_budget_is_the_inverse_of_the_figure(anchor: Anchor | None, ratio: float) -> None:
    r = reading(ratio=ratio, anchor=anchor, reserve=250)
    raw = r.raw_history_budget()
    assert r.history_figure(raw) <= r.target  # the trim target is met...
    assert r.history_figure(raw + 2) > r.target  # ...by the largest history that meets it


def test_reading_counts_from_the_anchor_at_the_marginal_ratio() -> None:
    r = reading(1100, ratio=2.0, anchor=Anchor(1000, 1500, 1.2))
    assert r.figure == 1500 + 120
    assert not r.counted and reading(1000, anchor=Anchor(1000, 1500)).counted


def test_reading_over_capacity_uses_the_figure_and_the_reserve() -> None:
    assert reading(4000, ratio=1.0, reserve=0).over_capacity() == 0
    assert reading(4000, ratio=1.0, reserve=200).over_capacity() == 104
    assert reading(40000, capacity=Capacity(None)).over_capacity() == 0  # unknown: never refused


def test_anchor_learns_the_marginal_ratio_and_ignores_small_steps() -> None:
    first = next_anchor(None, 1000, 900)
    assert first.ratio is None
    second = next_anchor(first, 2000, 2200)
    assert second.ratio == pytest.approx(1.3)
    assert next_anchor(second, 2010, 2250).ratio == second.ratio  # a 10-token step says too little


def test_breakdown_parts_add_up_to_the_history_estimate() -> None:
    """System, history and images split the ledger's estimate (images of a tool result count in
    the current turn only); the trimmed figure is passed in, scaled like the rest."""
    png = [Image("image/png", "aGVsbG8=")]
    messages = [ChatMessage("system", "be brief " * 10),
                ChatMessage("user", "old look", images=png, turn_id="t1"),
                ChatMessage("assistant", "seen " * 20, turn_id="t1"),
                ChatMessage("user", "now look", images=png, turn_id="t2"),
                ChatMessage("tool", "shot", images=png, tool_call_id="c", name="camera", turn_id="t2")]
    ledger = HistoryLedger(messages, image_token_cost=500)
    parts = breakdown(reading(ledger.estimate, ratio=2.0), ledger, trimmed=70)
    text = sum(m.text_tokens for m in messages)
    assert parts["image_tokens"] == 2 * (estimate_history_tokens(messages, 500) - text) == 2 * 1500
    assert parts["system_tokens"] == 2 * messages[0].text_tokens
    assert parts["system_tokens"] + parts["history_tokens"] + parts["image_tokens"] == 2 * ledger.estimate
    assert parts["trimmed_tokens"] == 140


def test_a_count_of_a_conversation_prices_what_comes_next_and_one_of_its_preamble_does_not() -> None:
    # A session just opened: the system prompt and tool schemas counted at 1.4 a raw token (schemas
    # are dense) say nothing of a question's price; the route's calibration (0.9) prices it.
    opened = count_anchor(None, 500, 700, conversation=False)
    assert reading(600, ratio=0.9, anchor=opened).figure == 700 + 90
    chatted = count_anchor(None, 500, 700)
    assert reading(600, ratio=0.9, anchor=chatted).figure == 700 + 140
    # A count after a reply keeps the price the session learned.
    assert reading(600, ratio=0.9, anchor=count_anchor(Anchor(400, 380, base=0.8), 500, 700)).figure == 780
