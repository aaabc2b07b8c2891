"""What a request's new content is, as a tokenizer sees it: its kind and its pieces per byte.

The meter prices what follows the last counted reply (``server/routing/meter.py``). A tokenizer
prices a prose question, a JSON tool result, code and CJK text very differently per byte (a real
BPE vocabulary: 0.6 to 2.8 tokens per 4 bytes over those), so:

- ``content_kind`` names the kind of the messages after the last reply from their characters, not
  their meaning (``json``, ``cjk``, ``dense``, ``prose``, ``image``; a tool's output kept apart from
  what people write), and the meter learns each kind's ratio from the provider's counts;
- ``piece_density`` prices a kind never counted yet. A tokenizer first cuts text into pieces (a
  run of letters, up to three digits, a punctuation mark, a CJK character, a line break with its
  indentation, up to three brackets, quotes and the marks beside them) and then each piece into
  tokens; common pieces are one token each, so tokens per piece varies far less across kinds than
  tokens per byte (``bench/pieces.py`` measures it on three real vocabularies). A session that
  counted a reply of one kind thus prices the first JSON after it by the pieces each holds per byte.

Every function reads at most ``SAMPLE_CHARS`` characters of a message: the cost stays flat.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from server.history.messages import TOOL_RESULTS_PREFIX, ChatMessage

SAMPLE_CHARS = 4096
CJK_SHARE = 0.3  # of a text's characters: CJK script (a token a character or more, 3 UTF-8 bytes)
DENSE_SHARE = 0.2  # of its non-space characters, neither letters nor CJK: JSON, code, tables, numbers
_CJK = "\u3000-\u9fff\uac00-\ud7af\uff00-\uffef"
# Brackets, quotes and the marks around them merge in runs (``[{"``, ``"],``, ``</``, ``="``).
_PIECE = re.compile(rf"[{_CJK}]|[^\W\d_{_CJK}]+|\d+|_|\n\s*|[\[\]{{}}\",:<>/=()]{{1,3}}|[^\w\s]")
MIN_DENSITY_BYTES = 64  # a shorter text says too little about its pieces
DIGITS_TELL = 1.05  # a text with 5 % more pieces cut digit by digit tells how a vocabulary cuts numbers


def _is_cjk(char: str) -> bool:
    return "\u3000" <= char <= "\u9fff" or "\uac00" <= char <= "\ud7af" or "\uff00" <= char <= "\uffef"


def text_kind(text: str) -> str:
    """``json`` (a JSON object or array: quotes, braces and keys), ``cjk``, ``dense`` (punctuation,
    digits, symbols: code, tables) or ``prose``: kinds of text a tokenizer prices differently per
    byte, told apart by their characters, not by their meaning."""
    sample = text[:SAMPLE_CHARS]
    head, tail = sample.lstrip()[:1], text.rstrip()[-1:]
    if (head, tail) in (("{", "}"), ("[", "]")):
        return "json"
    visible = [c for c in sample if not c.isspace()]
    if not visible:
        return "prose"
    cjk = sum(1 for c in visible if _is_cjk(c))
    if cjk >= CJK_SHARE * len(visible):
        return "cjk"
    symbols = sum(1 for c in visible if not c.isalpha())
    return "dense" if symbols >= DENSE_SHARE * len(visible) else "prose"


def message_kind(message: ChatMessage) -> str:
    """``origin/kind``: a tool's output (``tool/``) is kept apart from what people write
    (``message/``: questions and replies), whose densities differ even in one script: a document a
    tool returns is not the chat about it."""
    origin = "tool" if message.role == "tool" or message.content.startswith(TOOL_RESULTS_PREFIX) \
        else "message"
    return f"{origin}/{'image' if message.images else text_kind(message.content)}"


def added(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The messages after the last reply: the part of a request the provider has not counted yet."""
    found: list[ChatMessage] = []
    for message in reversed(messages):
        if message.role == "assistant":
            break
        if message.left_out is None:
            found.append(message)
    return found


def content_kind(messages: Sequence[ChatMessage]) -> str | None:
    """The kind of what follows the last reply in ``messages`` (the new message, tool results). None
    when nothing follows it."""
    return kind_of(added(messages))


def kind_of(messages: Sequence[ChatMessage]) -> str | None:
    """The kind holding most of ``messages``' bytes (a message with images counts as large)."""
    sizes: dict[str, int] = {}
    for message in messages:
        kind = message_kind(message)
        sizes[kind] = sizes.get(kind, 0) + len(message.content) + (1 << 20 if message.images else 0)
    return max(sizes, key=lambda k: sizes[k]) if sizes else None


@dataclass(frozen=True)
class Density:
    """Pieces per raw token (UTF-8 bytes / 4, the estimate's unit) of a text, its numbers cut two
    ways, as vocabularies do: in groups of up to three digits (cl100k, o200k, Llama 3, Claude's) or
    digit by digit (the SentencePiece vocabularies of the Llama 2 family, Mistral's tekken)."""

    grouped: float
    single: float

    def of(self, digits: int) -> float:
        return self.single if digits == 1 else self.grouped


def piece_density(texts: Sequence[str]) -> Density | None:
    """The ``Density`` of ``texts``, read from the first ``SAMPLE_CHARS`` characters of each; None
    when they hold too little text to say."""
    pieces = grouped = single = size = 0
    for text in texts:
        sample = text[:SAMPLE_CHARS]
        for match in _PIECE.finditer(sample):
            if sample[match.start()].isdigit():
                run = match.end() - match.start()
                grouped, single = grouped + -(-run // 3), single + run
            else:
                pieces += 1
        size += len(sample.encode("utf-8"))
    if size < MIN_DENSITY_BYTES or not pieces + grouped:
        return None
    raw = size / 4
    return Density((pieces + grouped) / raw, (pieces + single) / raw)


def tokens_per_piece(tokens: int, raw: int, density: Density, digits: int) -> tuple[float, int]:
    """What a piece cost in a text of ``raw`` estimated tokens the provider counted ``tokens``, and
    how its vocabulary cuts numbers (3: in groups, 1: digit by digit): the cut under which a piece
    costs nearer one token, when the text holds enough digits to tell (else ``digits``, as known)."""
    grouped, single = tokens / (density.grouped * raw), tokens / (density.single * raw)
    if density.single > DIGITS_TELL * density.grouped:
        digits = 1 if abs(math.log(single)) < abs(math.log(grouped)) else 3
    return (single if digits == 1 else grouped), digits


def message_density(message: ChatMessage) -> Density | None:
    """``piece_density`` of a message's text and tool calls' arguments as they are sent."""
    calls = [call.name + json.dumps(call.arguments, ensure_ascii=False) for call in message.tool_calls or ()]
    return piece_density([message.content, *calls])
