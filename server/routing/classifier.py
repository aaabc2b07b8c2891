"""Pick a routing hint for a user message from ``[[classifier.rules]]``.

Contract: rules are tried in priority order, highest first; rules of equal priority keep their file
order (a stable sort). A rule matches when the text's UTF-8 byte length lies within
``[min_length, max_length]`` (``max_length`` 0 = no upper bound) and any keyword is a
case-insensitive substring, or any pattern is a case-sensitive substring, or the rule lists neither
(a pure length rule). The first matching rule's hint wins; no match gives ``None``.

The classifier only names a hint; ``server.routing.resolver.RouteResolver`` decides what the hint means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from server.config.settings import ClassifierRule


@dataclass(frozen=True)
class _CompiledRule:
    hint: str
    keywords: tuple[str, ...]  # already case-folded
    patterns: tuple[str, ...]
    min_length: int
    max_length: int

    def fits_length(self, size: int) -> bool:
        return size >= self.min_length and (self.max_length <= 0 or size <= self.max_length)

    def matches_content(self, text: str, folded: str) -> bool:
        if not self.keywords and not self.patterns:
            return True
        return any(k in folded for k in self.keywords) or any(p in text for p in self.patterns)


def _compile(rule: ClassifierRule) -> _CompiledRule:
    return _CompiledRule(
        hint=rule.hint,
        keywords=tuple(keyword.casefold() for keyword in rule.keywords),
        patterns=tuple(rule.patterns),
        min_length=rule.min_length,
        max_length=rule.max_length,
    )


class Classifier:
    """Hint chooser; built once from the settings, then pure and cheap per message."""

    def __init__(self, rules: Sequence[ClassifierRule]) -> None:
        ordered = sorted(rules, key=lambda rule: rule.priority, reverse=True)  # sorted() is stable
        self._rules = tuple(_compile(rule) for rule in ordered if rule.hint)

    def hint_for(self, text: str) -> str | None:
        if not self._rules:
            return None
        size = len(text.encode("utf-8"))
        folded = text.casefold()
        for rule in self._rules:
            if rule.fits_length(size) and rule.matches_content(text, folded):
                return rule.hint
        return None
