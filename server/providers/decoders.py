"""Incremental decoders for streamed provider replies: lines, Server-Sent Events, NDJSON.

Network chunks can split anywhere: inside a UTF-8 character, inside ``\\r\\n``, inside a field name.
``LineDecoder.feed(bytes)`` returns only the lines completed so far and keeps the rest, so each byte
is scanned once however small the chunks are. A line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r``
(the SSE rule; harmless for NDJSON, where a raw CR can only be whitespace between values).

``SSEDecoder`` follows the WHATWG event-stream rules: ``event:``, multi-line ``data:`` (joined with
``\\n``), ``id:``, ``retry:``, ``:`` comments, a blank line dispatches. One deliberate difference: at
end of input ``flush()`` dispatches a pending event instead of dropping it, so a server that closes
right after its last ``data:`` line still delivers it. Invalid UTF-8 becomes U+FFFD, never an error.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import AsyncGenerator, AsyncIterable, Iterator
from dataclasses import dataclass
from typing import Any

_LINE_END = re.compile(r"\r\n|\r|\n")


class LineDecoder:
    """Bytes in, complete text lines out (without their line ending)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []
        # A chunk ending in "\r" has ended its line; a "\n" opening the next chunk belongs to it.
        self._skip_lf = False

    def feed(self, data: bytes) -> list[str]:
        return self._split(self._utf8.decode(data))

    def flush(self) -> list[str]:
        lines = self._split(self._utf8.decode(b"", final=True))
        if self._parts:
            lines.append("".join(self._parts))
            self._parts.clear()
        return lines

    def _split(self, text: str) -> list[str]:
        if not text:
            return []
        if self._skip_lf:
            self._skip_lf = False
            text = text[1:] if text[0] == "\n" else text
        lines: list[str] = []
        start = 0
        for match in _LINE_END.finditer(text):
            piece = text[start : match.start()]
            if self._parts:
                piece = "".join(self._parts) + piece
                self._parts.clear()
            lines.append(piece)
            start = match.end()
        if start < len(text):
            self._parts.append(text[start:])
        elif text.endswith("\r"):
            self._skip_lf = True
        return lines


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


class SSEDecoder:
    """Bytes in, dispatched ``SSEEvent``s out."""

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, data: bytes) -> list[SSEEvent]:
        return self._events(self._lines.feed(data))

    def flush(self) -> list[SSEEvent]:
        events = self._events(self._lines.flush())
        pending = self._dispatch()
        return events + [pending] if pending else events

    def _events(self, lines: list[str]) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for line in lines:
            if not line:
                event = self._dispatch()
                if event is not None:
                    events.append(event)
            elif not line.startswith(":"):
                self._field(line)
        return events

    def _field(self, line: str) -> None:
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""  # an event with no data is not dispatched (WHATWG)
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data), self._id, self._retry)
        self._event = ""
        self._data = []
        return event


class NDJSONDecoder:
    """Bytes in, one parsed JSON value per non-blank line out. Lines are split at once; values are
    parsed as the caller iterates, so the values before a bad line arrive before its ``ValueError``."""

    def __init__(self) -> None:
        self._lines = LineDecoder()

    def feed(self, data: bytes) -> Iterator[Any]:
        return _parse(self._lines.feed(data))

    def flush(self) -> Iterator[Any]:
        return _parse(self._lines.flush())


def _parse(lines: list[str]) -> Iterator[Any]:
    for line in lines:
        if line.strip():
            yield json.loads(line)


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncGenerator[SSEEvent, None]:
    """Events of a byte stream, including the one ``flush`` finds at its end."""
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    for event in decoder.flush():
        yield event


async def aiter_ndjson(chunks: AsyncIterable[bytes]) -> AsyncGenerator[Any, None]:
    decoder = NDJSONDecoder()
    async for chunk in chunks:
        for value in decoder.feed(chunk):
            yield value
    for value in decoder.flush():
        yield value
