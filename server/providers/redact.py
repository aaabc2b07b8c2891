"""No credentials in what a provider error says.

``redact`` hides what looks like a secret in provider text (error bodies echo keys; transport errors
carry URLs): ``user:pass@`` in URLs, ``Authorization``/``api key``/``token`` values, ``sk-...`` keys,
long base64 or hex runs, and the given known secrets (the profile's key and base_url credentials).
``short_message`` is what an error frame may carry: redacted, one line, at most 300 characters.

Every pattern runs in time linear in the text (a pattern that could start anywhere inside a long run
is anchored to the run's start by a lookbehind), and ``clip`` bounds the text before any of them
runs: a provider's 64 KiB error body of one long run of letters cost a minute per pattern before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from server.providers.text import valid_text

MESSAGE_CHARS = 300
TEXT_CHARS = 64 * 1024  # the most of a provider's text any message or log line is made from
HIDDEN = "***"

_SECRETS = (
    # A scheme is matched from where its run of scheme characters starts (the lookbehind): started
    # at every letter of a long run, each attempt scanned to the run's end (quadratic).
    (re.compile(r"(?<![a-z0-9+.-])([a-z0-9+.-]+://)[^/\s:@]*(?::[^/\s@]*)?@", re.I), rf"\1{HIDDEN}@"),
    (re.compile(r"\b(bearer|basic)\s+[^\s\"',;]+", re.I), rf"\1 {HIDDEN}"),
    (re.compile(r"((?:authorization|api[-_ ]?key|access[-_ ]?token|secret|password|token)"
                r"[\"']?\s*[:=]\s*[\"']?)(?!\*\*\*)[^\s\"',;}]+", re.I), rf"\1{HIDDEN}"),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_\-]{6,}"), rf"\1-{HIDDEN}"),
)
_TOKEN = re.compile(r"(?<![A-Za-z0-9+/_\-])[A-Za-z0-9+/_\-]{32,}={0,2}")
_HEX = re.compile(r"[0-9a-fA-F]{32,}")
_SPACE = re.compile(r"\s+")


def clip(text: str, limit: int = TEXT_CHARS) -> str:
    """At most ``limit`` characters of ``text``; a cut never leaves half a word at the end (the first
    half of a key is still half a key)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    end = max(head.rfind(space) for space in " \t\n\r")
    return head[:end] if end > 0 else ""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` (clipped to ``TEXT_CHARS``) with what looks like a secret replaced by ``***``."""
    text = clip(text)
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, HIDDEN)
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return valid_text(_TOKEN.sub(_token, text))


def _token(match: re.Match[str]) -> str:
    # Long runs that mix digits with both cases (base64) or are all hex look like keys; a long model
    # or path name (lower case, words and dashes) is kept.
    run = match.group()
    mixed = any(c.isdigit() for c in run) and any(c.islower() for c in run) and any(c.isupper() for c in run)
    return HIDDEN if mixed or _HEX.fullmatch(run) else run


def short_message(text: str, secrets: Iterable[str] = ()) -> str:
    text = _SPACE.sub(" ", redact(text, secrets)).strip()
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 1] + "…"
