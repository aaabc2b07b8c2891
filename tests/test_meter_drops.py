"""What a trim leaves out is priced at the anchored request's average, not at the new content's.

A trim drops old turns of every kind (code replies, prose questions), so the meter takes them off
at what the counted request cost per estimated token (``Anchor.whole``) and moves the session's
anchors past them (``Anchor.without``); the trim budget solves the same accounting, so a trim lands
on its target and the notice's ``tokens_after`` is the meter's next figure. Units on ``Reading``;
through the server, a fake OpenAI provider (a real HTTP server) counting with a real vocabulary
answers prose questions with code in a window that forces a budget trim every turn: every send
from the second turn on is within 3 % of its count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.routing.anchor import Anchor
from server.routing.meter import Reading
from server.routing.resolver import Capacity, Route
from tests.fakes import FakeProvider, Reply
from tests.fakes.vocabularies import VOCABULARIES
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def test_content_left_out_is_priced_at_the_whole_request_ratio() -> None:
    anchor = Anchor(1000, 500, ratio=2.0, counted=False)  # 0.5 a raw token on average
    reading = Reading(Route("p", "m"), Capacity(None), 0, 1100, anchor=anchor)
    assert reading.figure == 500 + 200  # the 100 added since the count, at the step ratio
    assert reading.count(800) == 700 - 150  # 300 left out, at the whole request's 0.5
    assert reading.count(1200) == 700 + 200
    for figure in (300, 550, 700, 900):
        raw = reading.raw_for(figure)
        assert reading.count(raw) <= figure < reading.count(raw + 1) + 1
    moved = anchor.without(300)
    assert (moved.raw, moved.reported, moved.counted) == (700, 350, False)
    assert moved.whole == anchor.whole
    after = Reading(Route("p", "m"), Capacity(None), 0, 800, anchor=moved)
    assert after.figure == reading.count(800)  # the trim's result, as the trim budget saw it


def words(n: int, seed: int) -> str:
    vocabulary = "window budget token reply history route model session summary schema".split()
    return " ".join(vocabulary[(seed * 3 + k * 7) % len(vocabulary)] for k in range(n))


def code(lines: int, seed: int) -> str:
    return "\n".join(f"    values[{seed * 100 + n}] = compute_step_{n}(values[{n}], {seed})  # step {n}"
                     for n in range(lines))


def counting(tokens: Any) -> Any:
    def count(body: dict[str, Any]) -> int:
        return sum(3 + tokens(m.get("content") or "") for m in body["messages"])
    return count


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
async def test_sends_after_budget_trims_match_the_count(tmp_path: Path, fake_openai: FakeProvider,
                                                        vocabulary: str) -> None:
    tokens = VOCABULARIES[vocabulary]
    count = counting(tokens)

    def answer(body: dict[str, Any]) -> Reply:
        text = code(24, len(body["messages"]))
        return Reply(text=[text], usage=(count(body), tokens(text)))

    fake_openai.default = answer
    provider = {"kind": "openai", "base_url": fake_openai.base_url, "model": "m", "discover_window": False,
                "context_window": 2500}
    with serve(settings_for(tmp_path, {"providers": {"p": provider}})) as address:
        async with client(address) as c:
            await c.hello()
            frames = []
            for turn in range(10):
                frames.append(await c.say(f"question {turn}: {words(60, turn)}?"))
    trims = [f for turn in frames for f in of_type(turn, "history_trimmed")]
    assert len(trims) >= 3
    sends = [f for turn in frames for f in of_type(turn, "context") if f["reason"] == "send"]
    bodies = [r.json for r in fake_openai.requests]
    errors = [(s["estimated_tokens"] - count(b)) / count(b) for s, b in zip(sends, bodies, strict=True)]
    print(vocabulary, "errors per call:", [f"{e:+.1%}" for e in errors])
    assert max(abs(e) for e in errors[1:]) < 0.03
    assert json.dumps(bodies[-1]).count("question") < 10  # the window forced old turns out
