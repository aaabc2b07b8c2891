"""An incremental twin of ``history_trim`` for a session's every-turn path (pure, no I/O).

``HistoryLedger`` holds the provider-facing history (leading system messages, an optional breadcrumb,
then the body) with running totals: prefix sums of each body row's cost and of its text tokens, and
the index of each turn start. ``estimate`` and ``text_tokens`` are O(1); ``append`` is O(1) per
message; ``trim``/``trim_turn_count`` cost O(dropped turns + dropped messages). Results agree with
``estimate_history_tokens`` and with ``trim_to_recent_turns``/``trim_to_recent_turn_count`` on the
same messages.

How ``server.sessions.session.Session`` uses it: it builds one from the transcript's sendable messages (its
leading system messages, the session's own breadcrumb when older turns were left out to fit, then
every message still sent), ``append``s each message that joins the history, calls ``trim`` /
``trim_turn_count`` before each provider call and marks ``report.dropped`` trimmed in the
transcript, and sends ``messages()``. Anything that changes old messages (group compaction, a
set-aside turn, the orphan sweep on restore) is followed by ``Session.rebuild``.
"""

from __future__ import annotations

from collections.abc import Iterable

from server.history.messages import (
    DEFAULT_IMAGE_TOKEN_COST,
    ChatMessage,
    image_tokens,
    is_turn_start,
    old_turn_tokens,
)
from server.history.trim import (
    BREADCRUMB_TOKENS,
    REASON_OVERFLOW,
    REASON_TOKEN_BUDGET,
    REASON_TURN_LIMIT,
    TrimReport,
    new_breadcrumb,
    recovery_budget,
)

_COMPACT_AFTER = 1024  # dropped rows kept in the arrays before they are sliced away (amortised)


class HistoryLedger:
    def __init__(self, messages: Iterable[ChatMessage] = (), *,
                 image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST) -> None:
        self.image_token_cost = image_token_cost
        self._system: list[ChatMessage] = []
        self._system_tokens = 0
        self._crumb: ChatMessage | None = None
        self._rows: list[ChatMessage] = []  # body rows; rows[:_head] were dropped
        self._cum = [0]  # _cum[i] = cost of _rows[:i], images counted as for an old turn
        self._text_cum = [0]  # _text_cum[i] = text tokens of _rows[:i] (the meter's parts)
        self._head = 0
        self._starts: list[int] = []  # row index of each turn start; _starts[:_first] were dropped
        self._first = 0
        self._current_extra = 0  # tool-result images of the current turn, which stop counting later
        self.extend(messages)

    def extend(self, messages: Iterable[ChatMessage]) -> None:
        for message in messages:
            self.append(message)

    def append(self, message: ChatMessage) -> None:
        if not self._rows and self._crumb is None and message.role == "system":
            self._system.append(message)
            self._system_tokens += message.text_tokens
        elif not self._rows and self._crumb is None and message.breadcrumb:
            self._crumb = message
        else:
            self._append_row(message)

    def _append_row(self, message: ChatMessage) -> None:
        if is_turn_start(message):
            self._starts.append(len(self._rows))
            self._current_extra = 0
        cost = self.image_token_cost
        base = old_turn_tokens(message, cost)
        if self._starts:
            self._current_extra += image_tokens(message, in_current_turn=True,
                                                image_token_cost=cost) - (base - message.text_tokens)
        self._rows.append(message)
        self._cum.append(self._cum[-1] + base)
        self._text_cum.append(self._text_cum[-1] + message.text_tokens)

    @property
    def estimate(self) -> int:
        """``estimate_history_tokens(self.messages())`` without walking the history."""
        crumb = self._crumb.text_tokens if self._crumb is not None else 0
        body = self._cum[-1] - self._cum[self._head]
        return self._system_tokens + crumb + body + self._current_extra

    @property
    def text_tokens(self) -> int:
        """The text (and tool-call) tokens of ``messages()``, images left out, without a walk."""
        crumb = self._crumb.text_tokens if self._crumb is not None else 0
        return self._system_tokens + crumb + self._text_cum[-1] - self._text_cum[self._head]

    @property
    def system_tokens(self) -> int:
        return self._system_tokens

    @property
    def turns(self) -> int:
        return len(self._starts) - self._first

    def __len__(self) -> int:
        return len(self._system) + (self._crumb is not None) + len(self._rows) - self._head

    def messages(self) -> list[ChatMessage]:
        """The history to send, in order (O(n): building the request is O(n) anyway)."""
        crumb = [self._crumb] if self._crumb is not None else []
        return [*self._system, *crumb, *self._rows[self._head:]]

    def tail(self, limit: int = 64) -> list[ChatMessage]:
        """The newest ``limit`` messages to send, in order (the meter reads what follows the last
        reply from them without copying the whole history)."""
        rows = self._rows[max(self._head, len(self._rows) - limit):]
        return [*self._system, *rows] if len(rows) < limit else rows

    def _turns_to_drop(self, budget: int) -> int:
        crumb = self._crumb.text_tokens if self._crumb is not None else BREADCRUMB_TOKENS
        fixed = self._system_tokens + crumb + self._current_extra
        end = self._cum[-1]
        k = 1
        while k < self.turns - 1 and fixed + end - self._cum[self._starts[self._first + k]] > budget:
            k += 1
        return k

    def preview(self, budget: int) -> tuple[int, int]:
        """(turns, tokens) ``trim(budget)`` would drop, without changing anything."""
        before = self.estimate
        if budget <= 0 or before <= budget or self.turns <= 1:
            return 0, 0
        k = self._turns_to_drop(budget)
        cut = self._starts[self._first + k]
        crumb = 0 if self._crumb is not None else BREADCRUMB_TOKENS
        return k, max(0, self._cum[cut] - self._cum[self._head] - crumb)

    def trim(self, budget: int, *, reason: str = REASON_TOKEN_BUDGET) -> TrimReport:
        """Drop the fewest oldest whole turns so ``estimate`` fits ``budget`` (0 = never)."""
        if budget <= 0 or self.estimate <= budget or self.turns <= 1:
            return self._report([], 0, self.estimate, reason, budget)
        return self._drop(self._turns_to_drop(budget), reason, budget)

    def trim_turn_count(self, max_turns: int) -> TrimReport:
        """Keep the newest ``max(max_turns, 1)`` whole turns."""
        excess = self.turns - max(max_turns, 1)
        if excess <= 0:
            return self._report([], 0, self.estimate, REASON_TURN_LIMIT, None)
        return self._drop(excess, REASON_TURN_LIMIT, None)

    def trim_for_overflow(self) -> TrimReport:
        """Reactive recovery: trim to two thirds of the estimate; not ``trimmed`` = unrecoverable."""
        return self.trim(recovery_budget(self.estimate), reason=REASON_OVERFLOW)

    def _drop(self, k: int, reason: str, budget: int | None) -> TrimReport:
        before = self.estimate
        cut = self._starts[self._first + k]
        dropped = self._rows[self._head:cut]
        self._head = cut
        self._first += k
        if self._crumb is None:
            self._crumb = new_breadcrumb()
        self._compact()
        return self._report(dropped, k, before, reason, budget)

    def _report(self, dropped: list[ChatMessage], k: int, before: int, reason: str,
                budget: int | None) -> TrimReport:
        return TrimReport(dropped=dropped, dropped_turns=k, kept_turns=self.turns, tokens_before=before,
                          tokens_after=self.estimate, reason=reason, token_budget=budget)

    def _compact(self) -> None:
        head = self._head
        if head < _COMPACT_AFTER or head * 2 < len(self._rows):
            return
        base = self._cum[head]
        self._rows = self._rows[head:]
        self._cum = [total - base for total in self._cum[head:]]
        text = self._text_cum[head]
        self._text_cum = [total - text for total in self._text_cum[head:]]
        self._starts = [start - head for start in self._starts[self._first:]]
        self._head = 0
        self._first = 0
