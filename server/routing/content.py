"""What a request's new content is, as a tokenizer sees it: its kind and its pieces per byte.

The meter prices what follows the last counted reply (``server/routing/meter.py``). A tokenizer
prices a prose question, a JSON tool result, code and CJK text very differently per byte (a real
BPE vocabulary: 0.6 to 2.8 tokens per 4 bytes over those), so:

- ``content_kind`` names the kind of the messages after the last reply from their characters, not
  their meaning (``json``, ``cjk``, ``dense``, ``prose``, ``image``; a tool's output kept apart from
  what people write), and the meter learns each kind's ratio from the provider's counts;
- ``piece_density`` prices a kind never counted yet. A tokenizer first cuts text into pieces (a
  run of letters, up to three digits, a punctuation mark, a CJK character, a line break with its
  indentation, a JSON quote with the mark beside it) and then each piece into tokens; common pieces
  are one token each, so tokens per piece stays near one across kinds (0.9 to 1.1 for prose, code,
  JSON, logs, CSV, Japanese under the same vocabulary; German compounds 1.8 and base64 3.6 are the
  outliers) where tokens per byte varies fourfold. A session that counted a reply of one kind thus
  prices the first JSON after it by the pieces each holds per byte.

Every function reads at most ``SAMPLE_CHARS`` characters of a message: the cost stays flat.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from server.history.messages import TOOL_RESULTS_PREFIX, ChatMessage

SAMPLE_CHARS = 4096
CJK_SHARE = 0.3  # of a text's characters: CJK script (a token a character or more, 3 UTF-8 bytes)
DENSE_SHARE = 0.2  # of its non-space characters, neither letters nor CJK: JSON, code, tables, numbers
_CJK = "\u3000-\u9fff\uac00-\ud7af\uff00-\uffef"
_PIECE = re.compile(rf"[{_CJK}]|[^\W\d_{_CJK}]+|\d{{1,3}}|_|\n\s*|\"[:,\]}}]|[{{\[]\"|[^\w\s]")
MIN_DENSITY_BYTES = 64  # a shorter text says too little about its pieces


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


def piece_density(texts: Sequence[str]) -> float | None:
    """Pieces per raw token (UTF-8 bytes / 4, the estimate's unit) of ``texts``, read from the
    first ``SAMPLE_CHARS`` characters of each; None when they hold too little text to say."""
    pieces = size = 0
    for text in texts:
        sample = text[:SAMPLE_CHARS]
        pieces += sum(1 for _ in _PIECE.finditer(sample))
        size += len(sample.encode("utf-8"))
    return pieces / (size / 4) if size >= MIN_DENSITY_BYTES and pieces else None


def message_density(message: ChatMessage) -> float | None:
    """``piece_density`` of a message's text and tool calls' arguments as they are sent."""
    calls = [call.name + json.dumps(call.arguments, ensure_ascii=False) for call in message.tool_calls or ()]
    return piece_density([message.content, *calls])
