"""Real tokenizer vocabularies for the fake providers of the meter's tests and benches, read from
files Python packages ship (no network; the test extras install them, nothing imports the SDKs):

- ``claude``: Claude's former BPE tokenizer, the ``tokenizer.json`` the ``anthropic`` SDK shipped up
  to 0.38 (pinned at 0.34.2), read with Hugging Face's ``tokenizers``;
- ``tekken``: Mistral's tiktoken-style BPE (``tekken_240911.json`` of ``mistral-common``), built
  into a ``tiktoken.Encoding`` from its ranks and split pattern;
- ``llama``: Mistral 7B's SentencePiece model (``tokenizer.model.v1`` of ``mistral-common``, the
  Llama 2 family's kind of vocabulary), read with ``sentencepiece``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from functools import cache
from importlib import metadata
from pathlib import Path

import sentencepiece
import tiktoken
from tokenizers import Tokenizer


def _shipped(package: str, path: str) -> Path:
    return Path(str(metadata.distribution(package).locate_file(path)))


@cache
def _claude() -> Tokenizer:
    return Tokenizer.from_file(str(_shipped("anthropic", "anthropic/tokenizer.json")))


@cache
def _tekken() -> tiktoken.Encoding:
    data = json.loads(_shipped("mistral-common", "mistral_common/data/tekken_240911.json").read_text())
    config = data["config"]
    size = config["default_vocab_size"] - config["default_num_special_tokens"]
    ranks = {base64.b64decode(entry["token_bytes"]): entry["rank"] for entry in data["vocab"][:size]}
    return tiktoken.Encoding("tekken", pat_str=config["pattern"], mergeable_ranks=ranks, special_tokens={})


@cache
def _llama() -> sentencepiece.SentencePieceProcessor:
    model = _shipped("mistral-common", "mistral_common/data/tokenizer.model.v1")
    return sentencepiece.SentencePieceProcessor(model_file=str(model))


def claude_tokens(text: str) -> int:
    return len(_claude().encode(text, add_special_tokens=False).ids) if text else 0


def tekken_tokens(text: str) -> int:
    return len(_tekken().encode(text, disallowed_special=())) if text else 0


def llama_tokens(text: str) -> int:
    return len(_llama().encode(text)) if text else 0


VOCABULARIES: dict[str, Callable[[str], int]] = {
    "claude": claude_tokens, "tekken": tekken_tokens, "llama": llama_tokens}
