"""A real BPE vocabulary for the fake providers of the meter's tests and ``bench/meter.py``:
Claude's former tokenizer, the ``tokenizer.json`` the ``anthropic`` SDK shipped up to 0.38 (a test
extra pins 0.34.2 for that file alone; nothing imports the SDK). Read with Hugging Face's
``tokenizers``; no network."""

from __future__ import annotations

from functools import cache
from importlib import metadata

from tokenizers import Tokenizer


@cache
def vocabulary() -> Tokenizer:
    path = metadata.distribution("anthropic").locate_file("anthropic/tokenizer.json")
    return Tokenizer.from_file(str(path))


def bpe_tokens(text: str) -> int:
    """The tokens the vocabulary cuts ``text`` into (no special tokens)."""
    return len(vocabulary().encode(text, add_special_tokens=False).ids) if text else 0
