"""``ReplyWriter``: one assistant message of a turn, from its first streamed piece to the store.

Sans-I/O, in the manner of websockets' protocol objects: pieces go in (``append``) and the writer
says what the caller must do (``Step``); the caller does the I/O (the transcript, the store). The
writer never touches a session, a socket or a store, so it is tested with plain calls.

    append(text) -> Step.JOIN    the first piece: the message exists now; put it in the transcript
                 -> Step.FLUSH   the store is one flush interval behind: save ``flush()``
                 -> Step.NONE    nothing to do
    think(text)  a piece of the model's reasoning, kept on the message (a reload shows it again)
    current()    the message with the text so far (for a snapshot), or None before the first piece
    finish(...)  the completed message (or None when nothing was written); the writer is then empty

``began`` is when the current provider call began (its ``route`` frame's ``created_at``): the
message's ``created_at``, so the time the live page showed from that frame is the one a reload shows.
``served_by`` is the route that call was sent to, kept on the message from its first checkpoint: a
reply whose call never ended (a crash: no call record) still says which model wrote it.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence

from server.history.messages import ChatMessage, ServedBy, ToolCall


class Step(enum.Enum):
    NONE = "none"
    JOIN = "join"
    FLUSH = "flush"


class ReplyWriter:
    def __init__(self, turn_id: str, flush_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.turn_id = turn_id
        self.flush_seconds = flush_seconds
        self._clock = clock
        self._message: ChatMessage | None = None
        # The text is joined incrementally: a flush joins only the pieces since the last one,
        # not the whole reply again, and a long reply does not keep one object per piece.
        self._text = ""
        self._parts: list[str] = []
        self._thinking: list[str] = []
        self._flushed_at = 0.0
        self.began: str | None = None
        self.served_by: ServedBy | None = None

    @property
    def joined(self) -> bool:
        """The message exists (it has had a piece) and so sits in the transcript."""
        return self._message is not None

    def append(self, text: str) -> Step:
        self._parts.append(text)
        if self._message is None:
            # Interrupted until finished: a crash mid-reply leaves it marked so in the store.
            self._message = ChatMessage("assistant", "", turn_id=self.turn_id, interrupted=True,
                                        created_at=self.began, served_by=self.served_by)
            self._flushed_at = self._clock()
            return Step.JOIN
        if self._clock() - self._flushed_at >= self.flush_seconds:
            return Step.FLUSH
        return Step.NONE

    def think(self, text: str) -> None:
        self._thinking.append(text)

    @property
    def thought(self) -> bool:
        """Reasoning came with this reply (it is never sent back, though output counts may hold it)."""
        return bool(self._thinking)

    def current(self) -> ChatMessage | None:
        if self._message is not None:
            if self._parts:
                self._text += "".join(self._parts)
                self._parts.clear()
            self._message.set_content(self._text)
            self._message.thinking = "".join(self._thinking) or None
        return self._message

    def flush(self) -> ChatMessage:
        """The message to save now; the next flush is due one interval later."""
        message = self.current()
        if message is None:
            raise RuntimeError("flush() before the first piece: there is no message to save")
        self._flushed_at = self._clock()
        return message

    def finish(self, *, interrupted: bool,
               tool_calls: Sequence[ToolCall] | None = None) -> ChatMessage | None:
        """End the message (before tool results, or at the end of the turn). None when there is
        nothing to keep: no text and no tool calls."""
        message = self.current()
        if message is None and tool_calls:
            message = ChatMessage("assistant", "", turn_id=self.turn_id,
                                  thinking="".join(self._thinking) or None, created_at=self.began,
                                  served_by=self.served_by)
        self._message, self._text, self._parts, self._thinking = None, "", [], []
        if message is None:
            return None
        message.interrupted = interrupted
        message.set_tool_calls(tool_calls)
        return message if message.content or message.tool_calls else None
