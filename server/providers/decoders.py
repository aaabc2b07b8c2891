"""Incremental decoders for streamed provider replies: lines, Server-Sent Events, NDJSON.

Network chunks can split anywhere: inside a UTF-8 character, inside ``\\r\\n``, inside a field name.
``LineDecoder.feed(bytes)`` returns only the lines completed so far and keeps the rest. A line ends at
``\\n``, ``\\r\\n`` or a lone ``\\r`` (the SSE rule; harmless for NDJSON, where a raw CR can only be
whitespace between values). Lines are cut on bytes (those bytes never occur inside a UTF-8 sequence),
so each chunk's complete lines are decoded with one ``bytes.decode`` and split with one ``str.split``:
no per-character work in Python. A line longer than ``max_line_bytes`` raises ``LineTooLong`` as
soon as it is known to be too long, so a provider cannot grow memory with one endless line, nor
with one endless event of ``data:`` lines (its data has the same bound). One feed may complete many
lines: what they held before the long one is delivered first, then ``LineTooLong`` is raised.

``SSEDecoder`` follows the WHATWG event-stream rules: ``event:``, multi-line ``data:`` (joined with
``\\n``), ``id:``, ``retry:``, ``:`` comments, a blank line dispatches. One deliberate difference: at
end of input ``flush()`` dispatches a pending event instead of dropping it, so a server that closes
right after its last ``data:`` line still delivers it. Invalid UTF-8 becomes U+FFFD, never an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_MAX_LINE_BYTES = 1024 * 1024


# The C scanner json.loads ends in, called directly: json.loads wraps it in three Python calls and
# two regex matches per value, a third of the cost of parsing a streamed chunk.
_scan: Callable[[str, int], tuple[Any, int]] = vars(json.JSONDecoder())["scan_once"]


def parse_json(text: str) -> Any:
    """``json.loads(text)``, the same value or the same error, faster for one compact value (every
    streamed chunk); anything else (surrounding whitespace, a bad or extra part) goes to json.loads."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


class LineTooLong(ValueError):
    def __init__(self, limit: int, what: str = "a line") -> None:
        super().__init__(f"{what} longer than {limit} bytes")
        self.limit = limit
        self.lines: list[str] = []  # the complete lines the same feed held before the long one


class LineDecoder:
    """Bytes in, complete text lines out (without their line ending)."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._max = max_line_bytes
        self._pending: list[bytes] = []  # the unfinished line, in the pieces it came in
        self._pending_size = 0
        # A chunk ending in "\r" has ended its line; a "\n" opening the next chunk belongs to it.
        self._skip_lf = False

    @property
    def idle(self) -> bool:
        """No unfinished line is kept: the next byte begins a line."""
        return not self._pending and not self._skip_lf

    def feed(self, data: bytes) -> list[str]:
        if self._skip_lf and data:
            self._skip_lf = False
            if data[0] == 10:  # b"\n"
                data = data[1:]
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if not end:
            self._keep(data)
            return []
        head = data if end == len(data) else data[:end]
        if self._pending:
            head = b"".join(self._pending) + head
            self._pending.clear()
            self._pending_size = 0
        self._skip_lf = end == len(data) and data[-1] == 13  # b"\r"
        lines = self._split(head)
        if end < len(data):
            try:
                self._keep(data[end:])
            except LineTooLong as exc:
                exc.lines = lines
                raise
        return lines

    def flush(self) -> list[str]:
        if not self._pending:
            return []
        line = b"".join(self._pending).decode("utf-8", "replace")
        self._pending.clear()
        self._pending_size = 0
        return [line]

    def _split(self, head: bytes) -> list[str]:
        text = head.decode("utf-8", "replace")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n")
        lines.pop()  # the empty string after the last line ending
        if len(head) > self._max:
            for index, line in enumerate(lines):
                if len(line.encode("utf-8", "surrogatepass")) > self._max:
                    exc = LineTooLong(self._max)
                    exc.lines = lines[:index]
                    raise exc
        return lines

    def _keep(self, data: bytes) -> None:
        if not data:
            return
        self._pending_size += len(data)
        if self._pending_size > self._max:
            raise LineTooLong(self._max)
        self._pending.append(data)


@dataclass(slots=True)
class SSEEvent:
    event: str
    data: str
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return parse_json(self.data)


class SSEDecoder:
    """Bytes in, dispatched ``SSEEvent``s out."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._lines = LineDecoder(max_line_bytes)
        self._max = max_line_bytes
        self._event = ""
        self._data: list[str] = []
        self._data_size = 0  # characters of data: an event is bounded like a line
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, data: bytes) -> Iterable[SSEEvent]:
        """The events ``data`` completed; past a bound, the events before it, then ``LineTooLong``
        (one feed may hold many events: those before the long line or event are delivered)."""
        plain = self._plain(data)
        if plain is not None:
            return plain
        failure: LineTooLong | None = None
        try:
            lines = self._lines.feed(data)
        except LineTooLong as exc:
            lines, failure = exc.lines, exc
        events: list[SSEEvent] = []
        try:
            self._events(lines, events)
        except LineTooLong as exc:  # an event's data past the bound, before any long line
            failure = exc
        return events if failure is None else _then_raise(events, failure)

    def _plain(self, data: bytes) -> list[SSEEvent] | None:
        """The events of a feed that is whole events of one ``data:`` line each (what a provider
        sends per read: one event when the server keeps up, several when it fell behind), fed
        between two events, decoded without the line machinery; None for anything else."""
        decoder = self._lines
        if not (data.startswith(b"data: ") and data.endswith(b"\n\n")) or b"\r" in data \
                or self._data or self._event or decoder._pending or decoder._skip_lf:  # not .idle
            return None
        end = len(data) - 2
        if data.find(b"\n") == end:  # one event: the usual read, without a split
            if end > self._max:
                return None
            return [SSEEvent("message", data[6:end].decode("utf-8", "replace"), self._id, self._retry)]
        lines = data.split(b"\n\n")
        lines.pop()  # the empty bytes after the last event
        events: list[SSEEvent] = []
        for line in lines:
            if len(line) > self._max or not line.startswith(b"data: ") or b"\n" in line:
                return None  # a long line, another field, a line of its own: the general path says
            events.append(SSEEvent("message", line[6:].decode("utf-8", "replace"), self._id, self._retry))
        return events

    def flush(self) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        self._events(self._lines.flush(), events)
        pending = self._dispatch()
        return events + [pending] if pending else events

    def _events(self, lines: list[str], events: list[SSEEvent]) -> None:
        for line in lines:
            if not line:
                if self._data:
                    events.append(self._dispatch_data())
                else:
                    self._event = ""  # an event with no data is not dispatched (WHATWG)
            elif line.startswith("data: "):  # the common field, without the general parse
                self._add_data(line[6:])
            elif line[0] != ":":
                self._field(line)

    def _field(self, line: str) -> None:
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._add_data(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)

    def _add_data(self, value: str) -> None:
        # Many data lines and no blank line would grow one event without end: its data is bounded
        # by the line bound (one event carries one JSON value; a line could carry it whole).
        self._data_size += len(value) + 1
        if self._data_size > self._max:
            raise LineTooLong(self._max, "an event")
        self._data.append(value)

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""
            return None
        return self._dispatch_data()

    def _dispatch_data(self) -> SSEEvent:
        data = self._data
        event = SSEEvent(self._event or "message", data[0] if len(data) == 1 else "\n".join(data),
                         self._id, self._retry)
        self._event = ""
        self._data = []
        self._data_size = 0
        return event


class NDJSONDecoder:
    """Bytes in, one parsed JSON value per non-blank line out. Lines are split at once; values are
    parsed as the caller iterates, so the values before a bad line arrive before its ``ValueError``."""

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._lines = LineDecoder(max_line_bytes)

    def feed(self, data: bytes) -> Iterator[Any]:
        try:
            lines = self._lines.feed(data)
        except LineTooLong as exc:
            return _then_raise(_parse(exc.lines), exc)
        return _parse(lines)

    def flush(self) -> Iterator[Any]:
        return _parse(self._lines.flush())


def _then_raise(items: Iterable[T], exc: Exception) -> Iterator[T]:
    yield from items
    raise exc


def _parse(lines: list[str]) -> Iterator[Any]:
    for line in lines:
        if line.strip():
            yield parse_json(line)
