"""Provider text made valid before it leaves the provider layer.

A JSON string may hold a lone surrogate (``"\\ud83d"`` decodes to one), which no UTF-8 encoder
downstream (the store, the socket) accepts. ``valid_text`` replaces lone surrogates with U+FFFD and
joins a pair that arrived as two escapes. ``TextGuard`` does it for a whole reply: a high surrogate
that ends one delta waits for the next delta of its channel (text, thinking), so an emoji whose
surrogate pair a provider split across two deltas arrives whole. It also counts each delta against
the reply's ``ReplyBudget`` (it sees every delta once, on the one path they all take).
"""

from __future__ import annotations

import re
from typing import Any

from server.providers.base import Finish, StreamEvent, TextDelta, ThinkingDelta, ToolCallEvent
from server.providers.budget import ReplyBudget

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR_OR_LONE = re.compile("[\ud800-\udbff][\udc00-\udfff]|[\ud800-\udfff]")


def valid_text(text: str) -> str:
    if not _SURROGATE.search(text):
        return text
    return _PAIR_OR_LONE.sub(_join_pair, text)


def _join_pair(match: re.Match[str]) -> str:
    found = match.group()
    if len(found) == 2:
        return found.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    return "\ufffd"


def valid_value(value: Any) -> Any:
    """``valid_text`` through a JSON value (tool-call arguments)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_text(str(k)): valid_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_value(v) for v in value]
    return value


class SurrogateJoiner:
    """One channel's deltas made valid, a split surrogate pair joined across two deltas."""

    def __init__(self) -> None:
        self.high = ""

    def text(self, delta: str) -> str:
        if self.high:
            delta, self.high = self.high + delta, ""
        if delta.isascii() or not _SURROGATE.search(delta):  # isascii reads a flag: no scan
            return delta
        if "\ud800" <= delta[-1] <= "\udbff":  # the pair's low half may open the next delta
            delta, self.high = delta[:-1], delta[-1]
        return valid_text(delta)


class TextGuard:
    """A reply's events with their text made valid and counted; most events pass through untouched."""

    def __init__(self, budget: ReplyBudget) -> None:
        self._budget = budget
        self._text = SurrogateJoiner()
        self._thinking = SurrogateJoiner()

    def events(self, event: StreamEvent) -> tuple[StreamEvent, ...]:
        if type(event) is TextDelta:  # once per streamed piece: first, and with no call
            self._budget.take(len(event.text))
            text = self._text.text(event.text)
            if text is event.text:
                return (event,)
            return (TextDelta(text),) if text else ()
        if isinstance(event, ThinkingDelta):
            return self._thought(event)
        if isinstance(event, ToolCallEvent):
            return (self._call(event),)
        if isinstance(event, Finish):
            return self._finish(event)
        return (event,)

    def _thought(self, event: ThinkingDelta) -> tuple[StreamEvent, ...]:
        self._budget.take(len(event.text))
        text = self._thinking.text(event.text)
        if text is event.text:
            return (event,)
        return (ThinkingDelta(text),) if text else ()

    def _call(self, event: ToolCallEvent) -> ToolCallEvent:
        return ToolCallEvent(valid_text(event.id), valid_text(event.name), valid_value(event.arguments))

    def _finish(self, event: Finish) -> tuple[StreamEvent, ...]:
        # A high surrogate still waiting at the end never got its pair.
        out: list[StreamEvent] = [kind("\ufffd") for kind, joiner in
                                  ((TextDelta, self._text), (ThinkingDelta, self._thinking)) if joiner.high]
        reason, model = valid_text(event.reason), valid_text(event.model) if event.model else event.model
        out.append(event if reason is event.reason and model is event.model else Finish(reason, model))
        return tuple(out)
