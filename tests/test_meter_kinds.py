"""The meter prices what follows a reply by its kind of content, learned from the provider's counts.

Units: ``text_kind`` / ``content_kind`` tell JSON, dense text, CJK and prose apart, and a tool's
output from what people write; an ``Anchor`` learns a kind's ratio from a step that holds nothing
else. Through the server: a fake OpenAI provider (a real HTTP server) whose tokenizer prices JSON at
twice prose's tokens per byte, and the real ``mcp-server-time`` whose results are JSON. The first
JSON results on a route are priced blind; a second session on the route prices its first ones at
the ratio the first session's counts taught; a count endpoint never holds the tool loop's call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from server.history.messages import ChatMessage, Image
from server.routing.anchor import Anchor, next_anchor
from server.routing.content import CJK_SHARE, DENSE_SHARE, SAMPLE_CHARS, content_kind, text_kind
from server.routing.meter import Reading
from server.routing.resolver import Capacity, Route
from tests.fakes import Call, FakeProvider, Reply
from tests.mcp_support import time_server
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio

ZONES = ("Asia/Tokyo", "America/Lima", "Europe/Paris")
ANSWER = ("It is evening in Tokyo, where the lights of the city come on, early morning in Lima, before "
          "the markets open, and noon in Paris, when the cafes fill up for lunch.")  # long enough to teach


@pytest.mark.parametrize(("text", "kind"), [
    ('{"records": [{"id": 1, "name": "a"}]}', "json"),
    ('[1, 2, 3]', "json"),
    ("def f(x):\n    return x[0] + 1  # {x}\n", "dense"),
    ("w1-0 w1-1 w1-2 w1-3", "dense"),
    ("上下文窗口预算令牌估计提供者回复。", "cjk"),
    ("The meter shows how full the next request is, before it is sent.", "prose"),
    ("", "prose"),
])
def test_text_kinds(text: str, kind: str) -> None:
    assert text_kind(text) == kind


def plain_text_kind(text: str) -> str:
    """``text_kind`` by its definition, a character at a time (the server counts in C)."""
    sample = text[:SAMPLE_CHARS]
    head, tail = sample.lstrip()[:1], text.rstrip()[-1:]
    if (head, tail) in (("{", "}"), ("[", "]")):
        return "json"
    visible = [c for c in sample if not c.isspace()]
    if not visible:
        return "prose"
    if sum(1 for c in visible if "\u3000" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af"
           or "\uff00" <= c <= "\uffef") >= CJK_SHARE * len(visible):
        return "cjk"
    letters = sum(1 for c in visible if c.isalpha())
    return "dense" if len(visible) - letters >= DENSE_SHARE * len(visible) else "prose"


MIXED = ("abz AZ\n\t\x1c\u2003\xa0{}[]\",:<>/=()0129_-.;'"
         "\u2014\u2019\u201c\xe9\u01c5\xb2\xbd\u2163\u2460\u4e2d\u6587\ud55c\uff01\uff11\u3000\ud800")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=MIXED, max_size=300) | st.text(max_size=300)
       | st.text(alphabet=MIXED, min_size=SAMPLE_CHARS - 20, max_size=SAMPLE_CHARS + 20))
@example("ab" + "\u3000" * 5 + "cdefgh")  # an ideographic space is a space, not CJK
@example("x\xb2 \xbd \u2460 " * 20)  # numerals that are not letters
def test_text_kind_counts_as_its_definition(text: str) -> None:
    assert text_kind(text) == plain_text_kind(text)


def test_content_kind_is_what_follows_the_last_reply() -> None:
    question = ChatMessage("user", "What is in the records table? Answer briefly, please.")
    call = ChatMessage("assistant", "")
    result = ChatMessage("tool", '{"records": [{"id": 1}, {"id": 2}]}', tool_call_id="c1")
    assert content_kind([question]) == "message/prose"
    assert content_kind([question, call, result]) == "tool/json"
    assert content_kind([question, call]) is None  # nothing uncounted after the reply
    picture = ChatMessage("user", "and this?", images=[Image("image/png", "iVBORw0KGgo=")])
    assert content_kind([question, call, picture]) == "message/image"


def test_an_anchor_learns_a_kind_only_from_a_step_that_holds_nothing_else() -> None:
    anchor = next_anchor(None, 1000, 1200)
    past = anchor.with_reply(104, 150, "message/prose")  # the reply: 100 raw tokens counted 150
    assert past.kind_ratio("message/prose") == 1.5 and not past.counted
    after = past.then(past.raw + 200, past.reported + 500, "tool/json")
    assert after.kind_ratio("tool/json") == 2.5 and after.kind_ratio("message/prose") == 1.5
    # Without the reply's count the step holds the reply too: no kind is learned from it.
    blind = anchor.then(1300, 1800, "tool/json")
    assert blind.kind_ratio("tool/json") is None and blind.ratio == 2.0


def test_a_kind_learned_prices_only_its_kind() -> None:
    anchor = Anchor(1000, 1200, ratio=1.0, kinds=(("tool/json", 2.5),), counted=False)
    def reading(kind: str | None, route_ratio: float | None = None) -> Reading:
        return Reading(Route("p", "m"), Capacity(None), 0, 1200, anchor=anchor, kind=kind,
                       route_kind_ratio=route_ratio)

    assert reading("tool/json").figure == 1200 + 500
    assert reading("message/prose").figure == 1200 + 200  # the session's marginal ratio
    assert reading("message/cjk", route_ratio=1.5).figure == 1200 + 300  # the route's, for a new kind


def kind_tokens(text: str) -> int:
    """The fake provider's tokenizer: JSON costs two bytes a token, everything else four."""
    return len(text) // (2 if text.lstrip().startswith(("{", "[")) else 4)


def kind_count(body: dict[str, Any]) -> int:
    total = len(json.dumps(body.get("tools") or [])) // 4
    for message in body["messages"]:
        total += 3 + kind_tokens(message.get("content") or "")
        total += sum(len(json.dumps(call["function"])) // 4 for call in message.get("tool_calls") or ())
    return total


def answer(body: dict[str, Any]) -> Reply:
    """Three clocks asked for on a question (ids unique per request, as real providers make them),
    then an answer in prose; usage counted by ``kind_count``, the reply's output by the same rule."""
    count = kind_count(body)
    if body["messages"][-1]["role"] == "user":
        calls = [Call("time__get_current_time", {"timezone": zone}, f"call_{len(body['messages'])}_{n}")
                 for n, zone in enumerate(ZONES)]
        written = sum(len(json.dumps({"name": c.name, "arguments": json.dumps(c.arguments)})) // 4
                      for c in calls)
        return Reply(tool_calls=calls, usage=(count, written))
    return Reply(text=[ANSWER], usage=(count, kind_tokens(ANSWER)))


def settings(tmp_path: Path, fake: FakeProvider) -> Any:
    provider = {"kind": "openai", "base_url": fake.base_url, "model": "m1", "discover_window": False}
    return settings_for(tmp_path, {"providers": {"p": provider}, "mcp_servers": {"time": time_server()}})


async def clock_session(address: str) -> list[dict[str, Any]]:
    """A session of two turns, each a question then JSON results: its four sends' context frames."""
    async with client(address) as c:
        await c.hello()
        frames = await c.say("Which time is it? Tell me in words, in three cities of your choice.")
        frames += await c.say("And now, a minute later, which time is it in those three cities?")
    assert frames[-1]["type"] == "done", frames[-1]
    return [f for f in of_type(frames, "context") if f["reason"] == "send"]


def error(send: dict[str, Any], body: dict[str, Any]) -> float:
    return abs(send["estimated_tokens"] - kind_count(body)) / kind_count(body)


async def test_a_kind_counted_in_one_session_prices_the_next_sessions_first(
        tmp_path: Path, fake_openai: FakeProvider) -> None:
    fake_openai.default = answer
    with serve(settings(tmp_path, fake_openai)) as address:
        first = await clock_session(address)
        second = await clock_session(address)
    bodies = [r.json for r in fake_openai.requests]
    assert [m["role"] for m in bodies[1]["messages"][-4:]] == ["assistant", "tool", "tool", "tool"]
    errors = [error(send, body) for send, body in zip(first + second, bodies, strict=True)]
    print("errors per call:", [f"{e:.1%}" for e in errors])
    # The route's first JSON results are priced blind (at the session's ratio so far); from then on,
    # the session's next question and results, and the next session's first results, are not.
    assert errors[1] > 0.03
    assert max(errors[2], errors[3], errors[5], errors[6], errors[7]) < 0.03


async def test_without_a_count_the_first_json_of_a_route_is_priced_blind(tmp_path: Path,
                                                                         fake_openai: FakeProvider) -> None:
    """The limit, measured: nothing counted JSON on this route before its first results."""
    fake_openai.default = answer
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("Which time is it? Tell me in words, in three cities of your choice.")
    sends = [f for f in of_type(frames, "context") if f["reason"] == "send"]
    assert sends[1]["tokens_source"] == "estimate"
    assert error(sends[1], fake_openai.requests[1].json) > 0.03


def ends_in_results(body: Any) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    return bool(messages) and messages[-1]["role"] == "tool"


async def test_a_count_endpoint_never_holds_the_tool_loops_call(
        tmp_path: Path, fake_openai: FakeProvider) -> None:
    """Counts run between turns only: the call that carries tool results is never made to wait for a
    count of them (the first JSON of a route is priced blind here too), and the results' kind is
    learned from the call's own usage, so the next session's first results are priced by it."""
    fake_openai.default = answer
    fake_openai.counter = "vllm"
    with serve(settings(tmp_path, fake_openai)) as address:
        first = await clock_session(address)
        second = await clock_session(address)
    assert not [r for r in fake_openai.count_requests if ends_in_results(r.json)]
    bodies = [r.json for r in fake_openai.requests]
    errors = [error(send, body) for send, body in zip(first + second, bodies, strict=True)]
    assert first[1]["tokens_source"] == "estimate" and errors[1] > 0.03
    assert max(errors[5], errors[7]) < 0.03  # the next session's JSON results, priced as learned
