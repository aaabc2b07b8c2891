"""What a request's new content is, as a tokenizer sees it: its kind and its pieces per byte.

The meter prices what follows the last counted reply (``server/routing/meter.py``). A tokenizer
prices a prose question, a JSON tool result, code and CJK text very differently per byte (a real
BPE vocabulary: 0.6 to 2.8 tokens per 4 bytes over those), so:

- ``content_kind`` names the kind of the messages after the last reply from their characters, not
  their meaning (``json``, ``cjk``, ``dense``, ``prose``, ``image``; a tool's output kept apart from
  what people write), and the meter learns each kind's ratio from the provider's counts;
- ``piece_density`` prices a kind never counted yet. A tokenizer first cuts text into pieces (a
  run of letters, up to three digits, a punctuation mark, a CJK character, a line break with its
  indentation, up to three brackets, quotes and the marks beside them, an English contraction's
  ending such as ``'s``) and then each piece into tokens; common pieces are one token each, so
  tokens per piece varies far less across kinds than tokens per byte (``bench/pieces.py`` measures
  it on three real vocabularies). A session that counted a reply of one kind thus prices the first
  JSON after it by the pieces each holds per byte;
- ``Vocabulary`` is how a route's vocabulary cuts (numbers in groups or digit by digit, or words
  and marks), as the texts its provider counted tell.

Every function reads at most ``SAMPLE_CHARS`` characters of a message: the cost stays flat.
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from server.history.messages import TOOL_RESULTS_PREFIX, ChatMessage

SAMPLE_CHARS = 4096
CJK_SHARE = 0.3  # of a text's characters: CJK script (a token a character or more, 3 UTF-8 bytes)
DENSE_SHARE = 0.2  # of its non-space characters, neither letters nor CJK: JSON, code, tables, numbers
_CJK_VISIBLE = "\u3001-\u9fff\uac00-\ud7af\uff00-\uffef"
_CJK = "\u3000" + _CJK_VISIBLE  # with U+3000, the ideographic space
# Brackets, quotes and the marks around them merge in runs (``[{"``, ``"],``, ``</``, ``="``).
_PIECE = re.compile(rf"'(?:s|t|re|ve|m|ll|d)\b|[{_CJK}]|[^\W\d_{_CJK}]+|[^\D{_CJK}]+|_|\n\s*"
                    rf"|[\[\]{{}}\",:<>/=()]{{1,3}}|[^\w\s]")
_WORD = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")  # the words cut: letters and digits joined, marks alone
_DIGITS = re.compile(rf"[^\D{_CJK}]+")  # _PIECE's digit runs: a full-width digit is a CJK piece alone
_LETTERS = re.compile(r"[^\W\d_]+")  # alphanumeric but not a decimal digit: letters, and ² or ½
_CJK_RUNS = re.compile(rf"[{_CJK_VISIBLE}]+")
_ASCII = bytes(range(128))
_ASCII_LETTERS = bytes(c for c in range(128) if chr(c).isalpha())
MIN_DENSITY_BYTES = 64  # a shorter text says too little about its pieces
MAX_CLASSES_KEPT = 8192  # characters whose class is kept, of the non-ASCII ones met
DIGITS_TELL = 1.05  # a text with 5 % more pieces cut digit by digit tells how a vocabulary cuts numbers


def text_kind(text: str) -> str:
    """``json`` (a JSON object or array: quotes, braces and keys), ``cjk``, ``dense`` (punctuation,
    digits, symbols: code, tables) or ``prose``: kinds of text a tokenizer prices differently per
    byte, told apart by their characters, not by their meaning."""
    sample = text[:SAMPLE_CHARS]
    head, tail = sample.lstrip()[:1], text.rstrip()[-1:]
    if (head, tail) in (("{", "}"), ("[", "]")):
        return "json"
    visible = len("".join(sample.split()))
    if not visible:
        return "prose"
    letters, cjk = _letters_and_cjk(sample)
    if cjk >= CJK_SHARE * visible:
        return "cjk"
    return "dense" if visible - letters >= DENSE_SHARE * visible else "prose"


def _letters_and_cjk(sample: str) -> tuple[int, int]:
    """How many characters of ``sample`` are letters (``str.isalpha``) and how many are visible CJK.
    Counted in C, never a character at a time in Python (once per reply, it was 4 % of the server's
    CPU at 500 streams): the ASCII characters by a byte table, the few others by regular expressions."""
    # surrogatepass: a lone surrogate (a tool's JSON may carry one) is a character like any other.
    data = sample.encode("utf-8", "surrogatepass")
    others = _non_ascii(data)
    near = "".join(_LETTERS.findall(others))  # the letters, and the rare ² or ½ that is not one
    letters = len(data) - len(data.translate(None, _ASCII_LETTERS))
    letters += len(near) if near.isalpha() else sum(map(str.isalpha, near))
    return letters, sum(map(len, _CJK_RUNS.findall(others)))


def _non_ascii(data: bytes) -> str:
    """The non-ASCII characters of a text (its UTF-8 ``data``), in order."""
    return data.translate(None, _ASCII).decode("utf-8", "surrogatepass")


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


GROUPED, SINGLE, WORDS, BYTES = range(4)  # the cuts a ``Density`` counts pieces under
FLAT_FIT = 0.1  # under the words or bytes cut, every kind's piece cost the same within 10 % (log
PIECES_MISS = 0.2  # spread), where the pieces cut missed by over 22 %: the vocabulary cuts that way


@dataclass(frozen=True)
class Density:
    """Pieces per raw token (UTF-8 bytes / 4, the estimate's unit) of a text under four cuts, as
    vocabularies cut text before merging it into tokens:

    - ``GROUPED``: numbers in groups of up to three digits (cl100k, o200k, Llama 3, Claude's);
    - ``SINGLE``: numbers digit by digit (the SentencePiece vocabularies of the Llama 2 family,
      Mistral's tekken);
    - ``WORDS``: a run of letters and digits is one piece and every mark is its own (a word-level
      pre-tokenizer such as BERT's; ``w1`` one piece, ``":`` two);
    - ``BYTES``: a raw token is one piece (a count by bytes, as the demo provider's, and estimates
      some proxies report in place of a count).
    """

    per_cut: tuple[float, float, float, float]

    def of(self, cut: int) -> float:
        return self.per_cut[cut]

    @property
    def tells_digits(self) -> bool:
        """The text holds enough long numbers to tell how a vocabulary cuts them."""
        return self.per_cut[SINGLE] > DIGITS_TELL * self.per_cut[GROUPED]


def piece_density(texts: Sequence[str]) -> Density | None:
    """The ``Density`` of ``texts``, read from the first ``SAMPLE_CHARS`` characters of each; None
    when they hold too little text to say."""
    pieces = grouped = single = words = size = 0
    for text in texts:
        sample = text[:SAMPLE_CHARS]
        p, g, s, w = _matched(sample) if "\u3000" in sample else _counted(sample)
        pieces, grouped, single, words = pieces + p, grouped + g, single + s, words + w
        size += len(sample.encode("utf-8", "surrogatepass"))
    if size < MIN_DENSITY_BYTES or not pieces + grouped or not words:
        return None
    raw = size / 4
    return Density(((pieces + grouped) / raw, (pieces + single) / raw, words / raw, 1.0))


def _matched(sample: str) -> tuple[int, int, int, int]:
    """``sample``'s pieces (digits apart), digit pieces grouped and single, and words: by matching
    ``_PIECE`` and ``_WORD``, their definition."""
    # Each run of digits is one of _PIECE's matches (no other alternative takes a digit).
    runs = [len(run) for run in _DIGITS.findall(sample)]
    return (len(_PIECE.findall(sample)) - len(runs), sum(-(-run // 3) for run in runs), sum(runs),
            len(_WORD.findall(sample)))


def _counted(sample: str) -> tuple[int, int, int, int]:
    """What ``_matched`` counts, by byte counts in C, 6-10 times faster (matching cost 100-200 ns a
    character, a tenth of the CPU at the end of replies under load): each character becomes the byte
    of its class (``_class_of``) and a run is counted at its start (``" a"``). Not for a text with
    U+3000, a space that ``_PIECE`` takes as a CJK piece unless a line break before it took it."""
    classes = _classes(sample)
    marks = classes.count(b".")
    pieces = _runs(classes, _LETTERS_RUN) + classes.count(b"_") + marks
    if b"\n" in classes:  # a line break and the white space after it: one piece
        lines = classes.translate(_LINES, b" ")
        pieces += lines.count(b"xn") + lines.startswith(b"n")
    if b"[" in classes:
        pieces += _thirds(classes, _BRACKETS_RUN)
    if "'" in sample:
        pieces -= len(_CONTRACTION.findall(sample))  # a mark and a run of letters, one piece
    digits = classes.count(b"0")
    grouped = _thirds(classes, _DIGITS_RUN) if digits else 0
    return pieces, grouped, digits, _runs(classes, _WORD_RUN) + classes.count(b"[") + marks


def _classes(sample: str) -> bytes:
    """``sample`` a byte a character, each its class. A text whose only non-ASCII characters are
    marks (dashes, curly quotes, emoji) takes the encoder's own ``?`` for them, a call less each."""
    if not sample.isascii():
        if _NOT_MARK.search(_non_ascii(sample.encode("utf-8", "surrogatepass"))):
            return sample.encode("ascii", _CLASSES).translate(_CLASS_BYTES)
    return sample.encode("ascii", "replace").translate(_CLASS_BYTES)


def _runs(classes: bytes, table: bytes) -> int:
    """How many runs of the classes ``table`` turns into ``a`` (every other into a space)."""
    return (b" " + classes.translate(table)).count(b" a")


def _thirds(classes: bytes, table: bytes) -> int:
    """The pieces of up to three characters that those runs cut into: ceil(length / 3) a run."""
    return (b" " + classes.translate(table)).replace(b" a", b" aaa").count(b"aaa")


def _class_of(char: str) -> str:
    """The class of a character in ``_counted``'s bytes: ``a`` a letter (or a numeral such as ``²``),
    ``0`` a decimal digit, ``_``, ``[`` a mark of ``_PIECE``'s runs, ``.`` any other mark or a CJK
    character (a piece and a word alone), a line break, and a space for any other white space."""
    if char in "_\n":
        return char
    if char in _BRACKETS:
        return "["
    if _CJK_CHAR.match(char):
        return "."
    if char.isspace():
        return " "
    return "0" if char.isdecimal() else "a" if char.isalnum() else "."


class _Classes(dict[int, str]):
    """The classes of the characters met, by code point, for ``str.translate`` (a lookup in C)."""

    def __missing__(self, code: int) -> str:
        found = _class_of(chr(code))
        if len(self) < MAX_CLASSES_KEPT:
            self[code] = found
        return found


def _non_ascii_classes(error: UnicodeError) -> tuple[str, int]:
    assert isinstance(error, UnicodeEncodeError)
    return error.object[error.start:error.end].translate(_NON_ASCII), error.end


def _table(keep: str) -> bytes:
    """A translation of class bytes: those in ``keep`` to ``a``, every other to a space."""
    return bytes(ord("a") if chr(byte) in keep else ord(" ") for byte in range(256))


_BRACKETS = '[]{}",:<>/=()'
_CJK_CHAR = re.compile(f"[{_CJK}]")
_NOT_MARK = re.compile(rf"[\w\s{_CJK}]")
_CONTRACTION = re.compile(r"'(?:s|t|re|ve|m|ll|d)\b")  # _PIECE's first alternative
_NON_ASCII = _Classes()
_CLASSES = "meterchat.piece_classes"
codecs.register_error(_CLASSES, _non_ascii_classes)
_CLASS_BYTES = b"".join(_class_of(chr(c)).encode() for c in range(128)) + bytes(128)
_LETTERS_RUN, _WORD_RUN, _DIGITS_RUN, _BRACKETS_RUN = map(_table, ("a", "a0_", "0", "["))
_LINES = bytes(ord("n" if c == ord("\n") else "x") for c in range(256))  # and the spaces deleted


def piece_costs(tokens: float, raw: float, density: Density) -> tuple[float, ...]:
    """What a piece cost under each cut in a text of ``raw`` estimated tokens counted ``tokens``."""
    return tuple(max(tokens, 1) / (per_raw * raw) for per_raw in density.per_cut)


@dataclass(frozen=True)
class Vocabulary:
    """How a route's vocabulary cuts text, as its counts told: ``samples`` holds, per kind of
    content (``message_kind``), what a piece cost under each cut in the latest counted text of that
    kind. Numbers are cut the way under which a piece of a text rich in numbers cost nearer one
    token (``digits``). The words or the bytes cut (``flat``) is taken only when every kind sampled
    cost the same a piece under it while the pieces cut missed by far: no chat model's vocabulary
    cuts that way; a word-level rule or a count by bytes does."""

    samples: tuple[tuple[str, tuple[float, ...]], ...] = ()
    digits: int = GROUPED
    flat: int | None = None

    @property
    def cut(self) -> int:
        return self.digits if self.flat is None else self.flat

    @property
    def latest(self) -> tuple[float, ...] | None:
        """What a piece cost under each cut in the route's latest counted text."""
        return self.samples[-1][1] if self.samples else None

    def knows(self, kind: str | None) -> bool:
        return any(known == kind for known, _ in self.samples)

    def learned(self, kind: str, costs: tuple[float, ...], density: Density) -> Vocabulary:
        """This vocabulary with a counted text of ``kind``: its ``costs`` (``piece_costs``) replace
        the kind's older sample (a route's content drifts within a kind)."""
        samples = (*[(k, c) for k, c in self.samples if k != kind], (kind, costs))
        digits = self.digits
        if density.tells_digits:
            digits = SINGLE if abs(math.log(costs[SINGLE])) < abs(math.log(costs[GROUPED])) else GROUPED
        flat = None
        if len(samples) > 1 and _spread(samples, digits) > PIECES_MISS:
            fits = [(_spread(samples, cut), cut) for cut in (WORDS, BYTES)]
            spread, cut = min(fits)
            flat = cut if spread < FLAT_FIT else None
        return Vocabulary(samples, digits, flat)


def _spread(samples: Sequence[tuple[str, tuple[float, ...]]], cut: int) -> float:
    logs = [math.log(costs[cut]) for _, costs in samples]
    return max(logs) - min(logs)


def message_density(message: ChatMessage) -> Density | None:
    """``piece_density`` of a message's text and tool calls' arguments as they are sent."""
    calls = [call.name + json.dumps(call.arguments, ensure_ascii=False) for call in message.tool_calls or ()]
    return piece_density([message.content, *calls])
