"""Meter accuracy: the meter's figure before each send against what the provider then counted.

    python bench/meter.py [--quick] [--verbose]

A real meterchat server (in a thread) talks to the fake OpenAI provider (``tests/fakes``, a real
HTTP server on 127.0.0.1) whose tokenizer is nothing like meterchat's estimate (UTF-8 bytes / 4),
and is run once with each of five: three real vocabularies (``claude``, Claude's former BPE;
``tekken``, Mistral's tiktoken-style BPE; ``llama``, a Llama 2-style SentencePiece model:
``tests/fakes/vocabularies.py``) and ``synthetic``, 1.3 tokens a run of letters and digits, a
punctuation mark or a CJK character (a rule unlike real vocabularies: ``w1`` is one token, ``":`` two),
and ``bytes``, UTF-8 bytes / 4.4 (the demo provider's own count, the embedded default's).
Either way 3 a message, 765 an image, tool schemas at 3.8 bytes a token. Its ``completion_tokens``
is its own count of the reply (as a provider's is). The fake enforces a window
per model and refuses a longer prompt with OpenAI's overflow error, which names the window.
Scripted conversations (short chat, long replies, tool loops with long results, images, a switch to
a smaller model, a model whose window is not published, and mixed densities: code replies to prose
questions, a JSON tool result, CJK text) are replayed, and for every provider call the bench pairs
the ``context`` frame sent before it (``reason: "send"``) with the fake's count.

Printed per scenario: the error's median and worst case from the second turn on (and the worst of
the first turn, before any count), and the sends the provider refused for length although the meter
had shown them as fitting (window known; and window unknown, where "fitting" means within the
trimming budget). ``--verbose`` prints every call. The tools (``lookup_document``, a long prose
document, and ``query_records``, a JSON result) come from ``bench/loadkit/meter_tools.py``, a real MCP server
the server starts over stdio: a provider other than the demo is offered tools only through MCP.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.base import Call, Reply, running  # noqa: E402
from tests.fakes.openai_fake import FakeOpenAI  # noqa: E402
from tests.fakes.vocabularies import VOCABULARIES  # noqa: E402
from tests.support import client, serve, settings_for  # noqa: E402

WINDOWS = {"big": 32768, "small": 4096, "open": 8192}  # what the fake enforces
COUNTED = ("c/big",)  # the routes of the provider with a count endpoint
TOOL = "bench__"  # the model-facing prefix of the bench's MCP server's tools
TOOLS_SERVER = {"command": sys.executable, "args": [str(ROOT / "bench" / "loadkit" / "meter_tools.py")]}
PNG = {"media_type": "image/png", "data": "iVBORw0KGgo="}
WORDS = ("meter context window budget token estimate provider reply history trim route model "
         "anchor calibration session breadcrumb summary image schema tool result").split()
CJK = "上下文窗口预算令牌估计提供者回复历史修剪路由模型锚点校准会话摘要图像工具结果"
_CJK_RANGES = "\u3000-\u9fff\uac00-\ud7af"
# A CJK character is a token of its own (as in real tokenizers); other words and marks as before.
_TOKENS = re.compile(rf"[{_CJK_RANGES}]|[^\W{_CJK_RANGES}]+|[^\w\s]")


def synthetic_tokens(text: str) -> int:
    return math.ceil(1.3 * len(_TOKENS.findall(text)))


def byte_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4.4)


TOKENIZERS = {**VOCABULARIES, "synthetic": synthetic_tokens, "bytes": byte_tokens}
_tokenizer = [synthetic_tokens]  # the one the fake counts with now


def fake_tokens(text: str) -> int:
    return _tokenizer[0](text)


def fake_count(body: dict[str, Any]) -> int:
    """The fake tokenizer: deliberately unlike meterchat's bytes / 4."""
    total = 0
    for message in body["messages"]:
        total += 3
        parts = message.get("content") or ""
        for part in parts if isinstance(parts, list) else [{"type": "text", "text": parts}]:
            if part.get("type") == "image_url":
                total += 765
            else:
                total += fake_tokens(part.get("text", ""))
        for call in message.get("tool_calls") or ():
            total += fake_tokens(json.dumps(call["function"]))
    return total + math.ceil(len(json.dumps(body.get("tools") or [])) / 3.8)


def prose(words: int, seed: int) -> str:
    return " ".join(WORDS[(seed * 7 + n * 3) % len(WORDS)] + ("." if n % 11 == 10 else "")
                    for n in range(words))


def code(tokens: int, seed: int) -> str:
    """Short dense tokens, as code is (``w1-0 w1-1 ...`` counts three tokens in six bytes)."""
    return " ".join(f"w{seed}-{n}" + ("\n" if n % 8 == 7 else "") for n in range(tokens))


def cjk(chars: int, seed: int) -> str:
    return "".join(CJK[(seed * 5 + n * 7) % len(CJK)] + ("。" if n % 20 == 19 else "") for n in range(chars))


def reply_text(kind: str, length: int, seed: int) -> str:
    return {"code": code, "cjk": cjk}.get(kind, prose)(length, seed)


def call_function(call: Call) -> dict[str, Any]:
    """A tool call's function as meterchat sends it back in the next request."""
    return {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}


class CountingFake(FakeOpenAI):
    """The fake provider with vLLM's count endpoint, counting as its chat completions do."""

    def __init__(self) -> None:
        super().__init__()
        self.counter = "vllm"

    def reset(self) -> None:
        super().reset()
        self.counter = "vllm"

    @staticmethod
    def count_of(value: Any) -> int:
        return fake_count(value)


@dataclass
class Fake:
    """Answers every request: an overflow past the model's window, a tool call when asked to look
    something up (once per turn), else a reply of the length the user asked for."""

    counts: list[int] = field(default_factory=list)

    def reply(self, body: dict[str, Any]) -> Reply:
        count = fake_count(body)
        self.counts.append(count)
        window = WINDOWS[body["model"]]
        if count > window:
            return FakeOpenAI.overflow(window=window, requested=count)
        last = body["messages"][-1]
        text = last.get("content") if isinstance(last.get("content"), str) else ""
        if last["role"] == "user" and body.get("tools"):
            # A call id of its own, as real providers give (a repeated id's result is not sent again).
            call_id = f"call_{len(self.counts)}"
            call = (Call(TOOL + "lookup_document", {"title": "paper moon"}, call_id) if "look up" in text
                    else Call(TOOL + "query_records", {"limit": 40}, call_id) if "query records" in text
                    else None)
            if call is not None:
                return Reply(tool_calls=[call], usage=(count, fake_tokens(json.dumps(call_function(call)))))
        asked = re.search(r"reply (\d+)(?: (code|cjk))?", "".join(p.get("text", "") for p in _parts(last)))
        length = int(asked.group(1)) if asked and last["role"] == "user" else 40
        answer = reply_text(asked.group(2) or "" if asked and last["role"] == "user" else "", length,
                            len(self.counts))
        return Reply(text=[answer], usage=(count, fake_tokens(answer)))


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content") or ""
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def scenarios(turns: int) -> dict[str, tuple[str, list[tuple[str, Any]]]]:
    """name -> (starting route, steps); a step is ("say", (text, images)) or ("switch", route)."""
    def say(text: str, images: int = 0) -> tuple[str, Any]:
        return "say", (text, [PNG] * images)

    return {
        "short chat": ("p/big", [say(f"question {n}: {prose(12, n)}? reply 30") for n in range(turns)]),
        "long replies": ("p/big", [say(f"{prose(40, n)} reply 700") for n in range(turns)]),
        "tool loops": ("p/big", [say(f"look up paper moon, part {n}") for n in range(turns)]),
        "images": ("p/big", [say(f"what is in picture {n}? reply 60", images=1) for n in range(turns)]),
        "switch to smaller": ("p/big", [say(f"{prose(60, n)} reply 300") for n in range(turns)]
                              + [("switch", "p/small")]
                              + [say(f"and now {n}? reply 200") for n in range(max(3, turns // 2))]),
        "unknown window": ("p/open", [say(f"{prose(200, n)} reply 500") for n in range(turns + 4)]),
        "mixed densities": ("p/big", [say(mixed_question(n)) for n in range(turns)]),
        # The same on a provider with vLLM's POST /tokenize (counting with the same tokenizer).
        "mixed, count endpoint": ("c/big", [say(mixed_question(n)) for n in range(turns)]),
    }


def mixed_question(n: int) -> str:
    """Prose questions answered in code, a JSON tool result, CJK questions and answers, in turn."""
    return [f"{prose(30, n)}? reply 250 code", f"query records for part {n}, then sum them. reply 60",
            f"{cjk(60, n)}？ reply 120 cjk", f"{prose(50, n)}. reply 40"][n % 4]


@dataclass
class Send:
    turn: int
    figure: int
    count: int
    window: int | None
    budget: int
    overflowed: bool


@dataclass
class Result:
    sends: list[Send] = field(default_factory=list)
    refused: int = 0  # capacity_exceeded: meterchat refused before sending


async def replay(address: str, fake: Fake, route: str, steps: list[tuple[str, Any]]) -> Result:
    result = Result()
    async with client(address) as c:
        await c.hello()
        await c.send("switch_model", route=route)
        await c.until("context")
        if route in COUNTED:  # a user reads the page before typing: the switch's count lands first
            while (await c.until("context"))[-1]["reason"] != "count":
                pass
        turn = 0
        for kind, value in steps:
            if kind == "switch":
                await c.send("switch_model", route=value)
                await c.until("context")
                continue
            turn += 1
            first = len(fake.counts)
            text, images = value
            frames = await c.say(text, images=images) if images else await c.say(text)
            _collect(result, turn, frames, fake.counts[first:])
    return result


def _collect(result: Result, turn: int, frames: list[dict[str, Any]], counts: list[int]) -> None:
    sends = [f for f in frames if f["type"] == "context" and f["reason"] == "send"]
    result.refused += sum(1 for f in frames if f["type"] == "error" and f["code"] == "capacity_exceeded")
    for frame, count in zip(sends, counts, strict=False):
        window = frame.get("model_context_window")
        result.sends.append(Send(turn, frame["estimated_tokens"], count, window,
                                 frame["context_token_budget"], count > WINDOWS[frame["model"]]))


def summary(name: str, result: Result) -> str:
    errors = [abs(s.figure - s.count) / s.count for s in result.sends if s.turn >= 2]
    first = [abs(s.figure - s.count) / s.count for s in result.sends if s.turn == 1]
    fitting_known = sum(1 for s in result.sends if s.overflowed and s.window and s.figure <= s.window)
    fitting_unknown = sum(1 for s in result.sends if s.overflowed and not s.window and s.figure <= s.budget)
    overflows = sum(1 for s in result.sends if s.overflowed)
    median = f"{statistics.median(errors):.1%}" if errors else "-"
    worst = f"{max(errors):.1%}" if errors else "-"
    first_worst = f"{max(first):.1%}" if first else "-"
    return (f"| {name} | {len(result.sends)} | {first_worst} | {median} | {worst} | {overflows} | "
            f"{fitting_known} | {fitting_unknown} | {result.refused} |")


async def run(turns: int, verbose: bool, tokenizers: list[str]) -> None:
    fake = Fake()
    with running(FakeOpenAI(), "/v1") as provider, running(CountingFake(), "/v1") as counting, \
            tempfile.TemporaryDirectory() as tmp:
        provider.default = counting.default = fake.reply
        profile = {"kind": "openai", "model": "big", "context_window": WINDOWS["big"],
                   "discover_window": False, "models": {"small": WINDOWS["small"], "open": 0}}
        data = {"providers": {"p": {**profile, "base_url": provider.base_url},
                              "c": {**profile, "base_url": counting.base_url}},
                "mcp_servers": {"bench": TOOLS_SERVER}}
        for tokenizer in tokenizers:
            _tokenizer[0] = TOKENIZERS[tokenizer]
            # A fresh server per tokenizer: what a route learned under one says nothing of the other.
            with serve(settings_for(Path(tmp) / tokenizer, data)) as address:
                print(f"\ntokenizer: {tokenizer}\n")
                await table(address, fake, turns, verbose)


async def table(address: str, fake: Fake, turns: int, verbose: bool) -> None:
    print("| scenario | calls | worst (turn 1) | median error (turn 2+) | worst (turn 2+) | "
          "overflows | overflowed, shown fitting (window known) | same, window unknown | refused |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (route, steps) in scenarios(turns).items():
        result = await replay(address, fake, route, steps)
        print(summary(name, result))
        if verbose:
            for s in result.sends:
                print(f"    turn {s.turn}: meter {s.figure:,} provider {s.count:,} "
                      f"({(s.figure - s.count) / s.count:+.1%}){' overflow' if s.overflowed else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few turns per scenario (about a second)")
    parser.add_argument("--verbose", action="store_true", help="every call's figure and count")
    parser.add_argument("--tokenizer", choices=[*TOKENIZERS, "all"], default="all",
                        help="the fake provider's tokenizer (default: a table for each)")
    args = parser.parse_args()
    chosen = list(TOKENIZERS) if args.tokenizer == "all" else [args.tokenizer]
    anyio.run(run, 4 if args.quick else 12, args.verbose, chosen)


if __name__ == "__main__":
    main()
