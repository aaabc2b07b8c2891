"""A kind of content never counted on a route is priced by its pieces (``server/routing/content.py``).

Against three real vocabularies (``tests/fakes/vocabularies.py``): tokens per piece varies far less
across prose, code, JSON, CSV, logs and CJK than tokens per byte, once a vocabulary's way of cutting
numbers is known, and a counted reply with numbers in it tells that way. Units: a reading prices an
uncounted kind at the last counted reply's tokens per piece times the new content's pieces, and its
images at the anchored request's whole ratio. Through the server: a fake OpenAI provider (a real HTTP
server) counting with each vocabulary answers in code, then asks the real ``mcp-server-time`` for
three clocks; the call carrying the first JSON results of the route is within 3 % of its count, and
so under a word-level rule (``w1`` one token, ``":`` two). Which cut a route's counts choose: a word
rule's counts of code and prose agree only under the words cut, a count by bytes' only under the
bytes cut, a real vocabulary's under neither."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from server.history.messages import ChatMessage, Image
from server.routing.anchor import Anchor
from server.routing.content import (
    _PIECE,
    _WORD,
    BYTES,
    GROUPED,
    MIN_DENSITY_BYTES,
    SAMPLE_CHARS,
    SINGLE,
    WORDS,
    Density,
    Vocabulary,
    _counted,
    _matched,
    piece_costs,
    piece_density,
)
from server.routing.meter import Meter, Reading
from server.routing.resolver import Capacity, Route, RouteResolver
from tests.fakes import Call, FakeProvider, Reply
from tests.fakes.vocabularies import VOCABULARIES
from tests.mcp_support import time_server
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio

CODE = "\n".join(f"def step_{n}(values: list[int]) -> int:\n    total = sum(v * {n} for v in values)\n"
                 f"    return total % {n + 7}  # the {n}th step\n" for n in range(12))
PROSE = ("The meter shows how full the next request is before it is sent, and the user sees what a "
         "trim would leave out. ") * 8
SAMPLES = {
    "prose": PROSE,
    "code": CODE,
    "json": json.dumps([{"id": n, "name": f"record-{n}", "score": round(n / 7, 3), "active": n % 2 == 0}
                        for n in range(30)]),
    "json, indented": json.dumps({"rows": [{"id": n, "tags": ["a", "b"]} for n in range(12)]}, indent=2),
    "csv": "\n".join(f"{n},record-{n},{n / 7:.3f},active" for n in range(60)),
    "log": "\n".join(f"2026-12-02 11:{n:02d}:03 INFO web: GET /api/sessions/{n} 200" for n in range(40)),
    "cjk": "上下文窗口预算令牌估计提供者回复历史修剪路由模型。" * 12,
}


def told(count: Any, *texts: str) -> Vocabulary:
    """The vocabulary as counts of ``texts`` (one kind each) under ``count`` tell it."""
    vocabulary = Vocabulary()
    for n, text in enumerate(texts):
        density = piece_density([text])
        assert density is not None
        costs = piece_costs(count(text), len(text.encode()) / 4, density)
        vocabulary = vocabulary.learned(f"kind {n}", costs, density)
    return vocabulary


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
def test_tokens_per_piece_is_steadier_than_tokens_per_byte(vocabulary: str) -> None:
    count = VOCABULARIES[vocabulary]
    cut = told(count, SAMPLES["csv"]).cut
    per_byte, per_piece = {}, {}
    for name, text in SAMPLES.items():
        tokens = count(text)
        raw = len(text.encode("utf-8")) / 4
        density = piece_density([text])
        assert density is not None
        per_byte[name], per_piece[name] = tokens / raw, tokens / (density.of(cut) * raw)
    print(vocabulary, "cuts", cut)
    print("tokens per raw token:", {k: round(v, 2) for k, v in per_byte.items()})
    print("tokens per piece:", {k: round(v, 2) for k, v in per_piece.items()})
    assert max(per_byte.values()) / min(per_byte.values()) > 1.8
    # The widest is llama's indented JSON (1.31): SentencePiece spends tokens on indentation.
    assert max(per_piece.values()) / min(per_piece.values()) < 1.35
    assert cut == (GROUPED if vocabulary == "claude" else SINGLE)  # Claude's groups numbers, the others not


WORD = re.compile(r"[\u3000-\u9fff]|[^\W\u3000-\u9fff]+|[^\w\s]")


def word_rule(text: str) -> int:
    """A word-level rule, as ``bench/meter.py``'s synthetic fake counts: 1.3 tokens a run of
    letters and digits, a mark or a CJK character (``w1`` one token, ``":`` two)."""
    return math.ceil(1.3 * len(WORD.findall(text)))


def byte_rule(text: str) -> int:
    """A count by bytes, as the demo provider's: UTF-8 bytes / 4.4."""
    return math.ceil(len(text.encode()) / 4.4)


def test_a_vocabulary_cuts_words_or_bytes_only_when_every_kind_says_so() -> None:
    code = " ".join(f"w{n}-{n * 7}" for n in range(80))  # short words with digits in them
    # One kind cannot tell a word rule from a vocabulary of pieces: under both, code costs near one
    # token a piece.
    assert told(word_rule, code).cut != WORDS
    assert told(word_rule, code, PROSE).cut == WORDS
    assert told(word_rule, PROSE, code, SAMPLES["json"]).cut == WORDS
    assert told(byte_rule, code).cut != BYTES
    assert told(byte_rule, code, PROSE).cut == BYTES
    assert told(byte_rule, *SAMPLES.values()).cut == BYTES
    for name, count in VOCABULARIES.items():
        assert told(count, code, PROSE, SAMPLES["json"]).cut in (GROUPED, SINGLE), name
        assert told(count, *SAMPLES.values()).cut in (GROUPED, SINGLE), name


def plain_piece_density(texts: list[str]) -> Density | None:
    """``piece_density`` by its definition, a piece at a time (the server counts in C)."""
    pieces = grouped = single = words = size = 0
    for text in texts:
        sample = text[:SAMPLE_CHARS]
        for match in _PIECE.finditer(sample):
            run = match.group()
            if run.isdecimal():
                grouped, single = grouped + -(-len(run) // 3), single + len(run)
            else:
                pieces += 1
        words += len(_WORD.findall(sample))
        size += len(sample.encode("utf-8", "surrogatepass"))
    if size < MIN_DENSITY_BYTES or not pieces + grouped or not words:
        return None
    return Density(((pieces + grouped) / (size / 4), (pieces + single) / (size / 4), words / (size / 4), 1.0))


# Each class of character _counted tells apart, and the white space and numerals at their edges: the
# separators \x1c-\x1f, NEL, no-break space and U+2028 are white space to _PIECE, ² and ½ letters, ٣ a digit.
PIECES = ("abz AZ\n\t\r\x1c\x85\xa0\u2028  {}[]\",:<>/=()0123456789\u0663_-'st\u2014\u2019\xe9\xb2\xbd"
          "\u4e2d\ud55c\u3000\uff10\uff15\ud800\x00\x7f\U0001f600")
CONTRACTIONS = st.sampled_from(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'st"])
MIXED = st.lists(st.text(alphabet=PIECES, max_size=8) | CONTRACTIONS, max_size=60).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=PIECES, max_size=400) | MIXED | st.text(max_size=200), max_size=3))
@example(["\u4fa1\u683c\uff11\uff12\uff13\uff14\uff15\uff16\u5186\u3002" * 6])  # full-width digits
@example(["x\xb2abc \xbd 12345 it's {\"a\": [1, 2]}\n  y" * 4])
def test_piece_density_counts_as_its_definition(texts: list[str]) -> None:
    assert piece_density(texts) == plain_piece_density(texts)


@settings(max_examples=500, deadline=None)
@given((MIXED | st.text(alphabet=PIECES, max_size=300) | st.text(max_size=100))
       .map(lambda text: text.replace("\u3000", " ")))  # piece_density matches a text with U+3000
@example("40\uff10 1\uff15")  # a full-width digit after digits is a CJK piece of its own, not in their run
@example("it's 'sé 's_ 's1 'll\u4e2d don't 'Ve ''s")  # a contraction ends at a character not of a word
@example("a \n\x1c\u2028 \n b\r\n\xa0c")  # a line break takes every white space after it
@example("\u2014 \u2019s \U0001f600 and \xe9 ?")  # marks only, then a letter among them
def test_counting_by_classes_counts_as_matching(sample: str) -> None:
    assert _counted(sample) == _matched(sample)


def test_a_short_text_says_nothing_of_its_pieces() -> None:
    assert piece_density(["ok"]) is None and piece_density([]) is None


def reading(meter: Meter, anchor: Anchor, new: list[ChatMessage], vocabulary: Vocabulary | None = None
            ) -> Reading:
    vocabulary = vocabulary or Vocabulary()
    density = piece_density([m.content for m in new])
    pieces = meter.piece_ratio("p/m", vocabulary, anchor, new, density)
    return Reading(Route("p", "m"), Capacity(None), 0, anchor.raw + sum(m.text_tokens for m in new),
                   anchor=anchor, kind="tool/json", piece_ratio=pieces)


def test_an_uncounted_kind_is_priced_by_its_pieces(tmp_path: Path) -> None:
    settings = settings_for(tmp_path)
    meter = Meter(RouteResolver(settings, {}), settings.providers, image_cost=1000)
    result = ChatMessage("tool", SAMPLES["json"], tool_call_id="c1")
    density = piece_density([result.content])
    assert density is not None
    costs = (1.1, 0.9, 1.4, 0.8)  # what a piece cost in the last counted reply under each cut
    anchor = Anchor(1000, 1200, ratio=0.6, counted=False, costs=costs)
    priced = reading(meter, anchor, [result])
    assert priced.step_ratio == pytest.approx(1.1 * density.of(GROUPED))
    for cut in (SINGLE, WORDS):  # the cut the route's counts chose
        chosen = Vocabulary(digits=SINGLE, flat=WORDS if cut == WORDS else None)
        expected = costs[cut] * density.of(cut)
        assert reading(meter, anchor, [result], chosen).step_ratio == pytest.approx(expected)
    assert priced.step_ratio > 2 * 0.6  # JSON costs far more per byte than the chat before it
    # With no counted reply in the session, the route's latest counted text's costs.
    route = Vocabulary((("message/dense", (1.2, 1.0, 1.5, 0.9)),))
    assert reading(meter, Anchor(1000, 1200, ratio=0.6, counted=False), [result], route).step_ratio \
        == pytest.approx(1.2 * density.of(GROUPED))
    # A kind the session counted keeps its own ratio; with nothing counted, the step as before.
    learned = Anchor(1000, 1200, ratio=0.6, counted=False, costs=costs, kinds=(("tool/json", 1.7),))
    assert reading(meter, learned, [result]).step_ratio == 1.7
    assert reading(meter, Anchor(1000, 1200, ratio=0.6, counted=False), [result]).step_ratio == 0.6
    # An image is priced at the anchored request's whole ratio, its caption by its pieces.
    image = Image("image/png", "iVBORw0KGgo=")
    picture = ChatMessage("user", "and what is in this one? " * 4, images=[image])
    caption = piece_density([picture.content])
    assert caption is not None
    mixed = reading(meter, anchor, [picture])
    assert mixed.step_ratio == pytest.approx((picture.text_tokens * 1.1 * caption.of(GROUPED) + 1000 * 1.2)
                                             / (picture.text_tokens + 1000))


def counting(tokens: Any) -> Any:
    """A fake provider's count with a vocabulary: its tokens, 3 a message, the tools' JSON."""
    def count(body: dict[str, Any]) -> int:
        total = tokens(json.dumps(body.get("tools") or []))
        for message in body["messages"]:
            total += 3 + tokens(message.get("content") or "")
            total += sum(tokens(json.dumps(call["function"])) for call in message.get("tool_calls") or ())
        return total
    return count


def answering(tokens: Any) -> Any:
    """Code for the first question; three clocks for the second, then a line about them."""
    def answer(body: dict[str, Any]) -> Reply:
        count = counting(tokens)(body)
        last = body["messages"][-1]
        if last["role"] == "user" and "clock" in last["content"]:
            calls = [Call("time__get_current_time", {"timezone": zone}, f"call_{n}")
                     for n, zone in enumerate(("Asia/Tokyo", "America/Lima", "Europe/Paris"))]
            written = sum(tokens(json.dumps({"name": c.name, "arguments": json.dumps(c.arguments)}))
                          for c in calls)  # as the request carries them back
            return Reply(tool_calls=calls, usage=(count, written))
        text = CODE if last["role"] == "user" else "Evening in Tokyo, morning in Lima, noon in Paris."
        return Reply(text=[text], usage=(count, tokens(text)))
    return answer


@pytest.mark.parametrize("vocabulary", [*VOCABULARIES, "word rule"])
async def test_the_first_json_of_a_route_is_priced_by_its_pieces(tmp_path: Path, fake_openai: FakeProvider,
                                                                 vocabulary: str) -> None:
    tokens = VOCABULARIES.get(vocabulary, word_rule)
    fake_openai.default = answering(tokens)
    provider = {"kind": "openai", "base_url": fake_openai.base_url, "model": "m1", "discover_window": False}
    settings = settings_for(tmp_path, {"providers": {"p": provider}, "mcp_servers": {"time": time_server()}})
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("Write twelve small step functions in Python, please.")
            # Long enough to be sampled: with the code before it, it tells a word rule apart.
            frames += await c.say("Now read three clocks for me, Tokyo, Lima and Paris, and tell me which "
                                  "of the three cities is nearest to the end of its working day today.")
    assert frames[-1]["type"] == "done", frames[-1]
    sends = [f for f in of_type(frames, "context") if f["reason"] == "send"]
    bodies = [r.json for r in fake_openai.requests]
    assert [m["role"] for m in bodies[2]["messages"][-3:]] == ["tool", "tool", "tool"]
    count = counting(tokens)
    errors = [(send["estimated_tokens"] - count(body)) / count(body)
              for send, body in zip(sends, bodies, strict=True)]
    print("errors per call:", [f"{e:+.1%}" for e in errors])
    assert sends[2]["tokens_source"] == "estimate"  # nothing counted these results before the call
    assert abs(errors[2]) < 0.03
