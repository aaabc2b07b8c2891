"""A session's first request on a route is priced in two parts (``routing.learned.Opening``): the
preamble (system prompt and tool schemas) at the ratio earlier sessions' first counts taught the
route, the first message by its pieces. Pure: ``Opening`` and its inverse. Through the server: a fake
OpenAI provider (a real HTTP server) counting with each real vocabulary, tools from the real
``mcp-server-time``; the third session's first send (a long letter) is within 4 % of the provider's
count, where a whole-request calibration (the letter and the dense schemas at one ratio) is 15 to
16 % over."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from server.history.messages import ChatMessage
from server.routing.content import Vocabulary
from server.routing.learned import PREAMBLE, Opening
from server.routing.meter import Meter, Reading
from server.routing.resolver import Capacity, Route, RouteResolver
from tests.fakes import FakeProvider, Reply
from tests.fakes.vocabularies import VOCABULARIES
from tests.mcp_support import time_server
from tests.support import client, serve, settings_for

pytestmark = pytest.mark.anyio


def test_an_opening_prices_its_preamble_and_its_rest_apart_and_inverts() -> None:
    opening = Opening(raw=400, ratio=1.5, rest=0.8)
    reading = Reading(Route("p", "m"), Capacity(None), 0, 500, ratio=1.0, opening=opening)
    assert reading.figure == 600 + 80
    assert reading.count(300) == 450  # a request shorter than the preamble (a trim budget's question)
    for figure in (100, 599, 600, 601, 680, 5000):
        raw = reading.raw_for(figure)
        assert reading.count(raw) <= figure < reading.count(raw + 2)


IMAGE_TOKENS = 765  # what the provider counts an image (the meter's configured guess: 1,000)
PNG = {"media_type": "image/png", "data": "iVBORw0KGgo="}


async def test_a_conversation_switched_to_a_route_is_no_first_message(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    meter = Meter(RouteResolver(settings, {}), settings.providers)
    meter.kinds.learn("demo/demo-small", PREAMBLE, 1.4)
    meter.vocabularies["demo/demo-small"] = Vocabulary((("message/prose", (1.0, 1.0, 1.0, 0.9)),))
    route = Route("demo", "demo-small")
    system, question = ChatMessage("system", "Be brief. " * 20), ChatMessage("user", "and now? " * 20)
    first = await meter.read(route, 200, [], messages=[system, question])
    assert first.opening is not None and first.preamble == system.text_tokens
    switched = await meter.read(route, 900, [], messages=[system, ChatMessage("user", "look up paper moon"),
                                                          ChatMessage("assistant", "Every night " * 90),
                                                          question])
    assert switched.opening is None and switched.preamble == 0  # its count teaches no preamble either
    assert switched.figure == math.ceil(switched.ratio * 900)


def counting(tokens: Any) -> Any:
    """The provider's count with a vocabulary: its tokens, 3 a message, 765 an image, the tools' JSON."""
    def count(body: dict[str, Any]) -> int:
        total = tokens(json.dumps(body.get("tools") or []))
        for message in body["messages"]:
            content = message.get("content") or ""
            parts = content if isinstance(content, list) else [{"type": "text", "text": content}]
            total += 3 + sum(IMAGE_TOKENS if part["type"] == "image_url" else tokens(part["text"])
                             for part in parts)
        return total
    return count


LETTER = ("Dear keeper of the clocks, I found this letter in my grandfather's sea chest, and I would "
          "like to know what he meant by it. He writes that the ship kept two clocks below deck. ") * 12
# Short questions, then a long letter: a whole-request ratio learned from short first requests
# (mostly dense tool schemas) prices the letter's prose at the schemas' ratio.
QUESTIONS = ["Tell me about the history of timekeeping at sea, and why longitude was so hard to find.",
             "How did the marine chronometer change navigation, and who built the first one?",
             f"{LETTER} What did he mean?"]
ANSWER = ("Sailors could read their latitude from the sun and the stars, but longitude needs the time "
          "at home and the time aboard: every hour between them is fifteen degrees. ") * 4


def answering_in_prose(tmp_path: Path, fake: FakeProvider, vocabulary: str) -> Any:
    """The settings of a server whose provider (``fake``) counts with ``vocabulary`` and answers
    ``ANSWER``, offered the real ``mcp-server-time``'s tools."""
    tokens = VOCABULARIES[vocabulary]
    count = counting(tokens)
    fake.default = lambda body: Reply(text=[ANSWER], usage=(count(body), tokens(ANSWER)))
    provider = {"kind": "openai", "base_url": fake.base_url, "model": "m1", "discover_window": False}
    return settings_for(tmp_path, {"providers": {"p": provider}, "mcp_servers": {"time": time_server()}})


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
async def test_a_later_sessions_first_send_prices_the_preamble_the_route_learned(
        tmp_path: Path, fake_openai: FakeProvider, vocabulary: str) -> None:
    count = counting(VOCABULARIES[vocabulary])
    settings = answering_in_prose(tmp_path, fake_openai, vocabulary)
    firsts = []
    with serve(settings) as address:
        for question in QUESTIONS:  # one session each: the first teaches pieces, the second the preamble
            async with client(address) as c:
                await c.hello()
                frames = await c.say(question)
            assert frames[-1]["type"] == "done", frames[-1]
            firsts.append(next(f for f in frames if f["type"] == "context" and f["reason"] == "send"))
    bodies = [r.json for r in fake_openai.requests]
    assert len(bodies) == 3 and bodies[2]["tools"]  # the schemas are most of a first request
    errors = [(send["estimated_tokens"] - count(body)) / count(body) for send, body in zip(firsts, bodies,
                                                                                          strict=True)]
    print("first send's error per session:", [f"{e:+.1%}" for e in errors])
    assert abs(errors[2]) < 0.04  # a whole-request ratio: +15 to +16 %


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
async def test_the_first_count_with_an_image_teaches_what_an_image_costs(
        tmp_path: Path, fake_openai: FakeProvider, vocabulary: str) -> None:
    count = counting(VOCABULARIES[vocabulary])
    settings = answering_in_prose(tmp_path, fake_openai, vocabulary)
    with serve(settings) as address:
        for question in QUESTIONS[:2]:  # the route learns its pieces, then its preamble
            async with client(address) as c:
                await c.hello()
                await c.say(question)
        async with client(address) as c:
            await c.hello()
            await c.say("What is in this picture?", images=[PNG])
            frames = await c.say("And in this one?", images=[PNG])
    assert frames[-1]["type"] == "done", frames[-1]
    send = next(f for f in frames if f["type"] == "context" and f["reason"] == "send")
    expected = count(fake_openai.requests[-1].json)
    print(f"second image's send: {send['estimated_tokens']:,} against {expected:,}")
    # The image's configured 1,000 tokens at the whole request's ratio: 4.5 to 6 % over.
    assert abs(send["estimated_tokens"] - expected) / expected < 0.01
