"""``Session``: the in-memory owner of one session's history, kept durable through the store.

A session owns its transcript (every message, including those no longer sent), the marks on it, the
``HistoryLedger`` of what the next provider call sends (``to_send``), its breadcrumb, and the
operations on them: ``trim`` (mark what a trim dropped) and ``emit_meter`` (the ``context`` frame);
setting turns aside (kept, no longer sent) is ``server.sessions.set_aside``'s. Its frames
go out through its ``FrameChannel``. The store and the meter are needed only by the operations that
save marks or read the meter; a session built without them (benchmarks, history tests) is the plain
in-memory history. The turn in flight belongs to the session, not to a socket, so
it survives a disconnect; the reply being streamed joins the transcript at its first piece (so a
snapshot shows it) and the ledger when it is complete.

Writes off the turn's path: the user's message (``store_soon``) and a trim's record (``keep_trim``)
are written in the background (given a task group: ``server.sessions.writes``), so the provider
call need not wait for the store; a turn holds them until its first chunk is out. ``unsaved`` holds
every message of the transcript not yet in the store, in order; a reply's save (``save_reply``)
writes them first, so the user's message is stored before its turn's reply and before ``done``, and
a message the store refused stays there until a later save succeeds. A trim record the store
refused is raised by ``check_writes`` when the turn ends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import anyio
from anyio.abc import TaskGroup

from server.errors import StoreUnavailable
from server.history.compaction import TRUNCATED
from server.history.ledger import HistoryLedger
from server.history.messages import (
    BREADCRUMB_TEXT,
    DEFAULT_IMAGE_TOKEN_COST,
    TRIMMED,
    ChatMessage,
    left_out_tokens,
)
from server.history.trim import TrimReport
from server.protocol import server_frame
from server.routing.anchor import Anchor
from server.routing.meter import Meter, Reading
from server.routing.resolver import Route
from server.sessions.approvals import Approvals
from server.sessions.channel import Frame, FrameChannel
from server.sessions.metrics import COUNTED, Metrics
from server.sessions.notices import OBSERVED, Notice, Notices
from server.sessions.reply import ReplyWriter
from server.sessions.writes import Writes
from server.store.base import CallRecord, Store

WATCHED = OBSERVED | COUNTED  # the frame types emit looks at twice; never a chunk


@dataclass
class TurnHandle:
    turn_id: str
    cancel_scope: anyio.CancelScope
    done: anyio.Event = field(default_factory=anyio.Event)


def utc_now() -> str:
    """A message's ``created_at``: ISO-8601 UTC, the store's spelling of a time."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def dropped_ids(messages: list[ChatMessage]) -> dict[str, list[str]]:
    """``message_ids`` and ``turn_ids`` (in order, once each) of a ``history_trimmed`` frame."""
    turns = list(dict.fromkeys(m.turn_id for m in messages if m.turn_id))
    return {"message_ids": [m.id for m in messages], "turn_ids": turns}


class Session:
    def __init__(self, session_id: str, title: str, route: Route, transcript: list[ChatMessage], *,
                 channel: FrameChannel, store: Store | None = None, meter: Meter | None = None,
                 image_token_cost: int = DEFAULT_IMAGE_TOKEN_COST, calls: list[CallRecord] | None = None,
                 trims: list[dict[str, Any]] | None = None, notices: list[Notice] | None = None,
                 metrics: Metrics | None = None, tasks: TaskGroup | None = None) -> None:
        self.id = session_id
        self.title = title
        self.route = route
        self.transcript = transcript
        self.channel = channel
        self.turn: TurnHandle | None = None
        self.reply: ReplyWriter | None = None  # the reply being streamed, while it has a message
        self.breadcrumb = ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True, id="breadcrumb-" + session_id)
        self.client_ids = {m.id for m in transcript if m.role == "user"}  # resends are ignored
        self.image_token_cost = image_token_cost
        # What a reload draws besides the transcript: each turn's provider calls (route, usage,
        # cost) and the trims with where they happened.
        self.calls = calls if calls is not None else []
        self.trims = trims if trims is not None else []
        self.notices = Notices(notices)  # errors, notices, switches: the transcript's other lines
        self.approvals = Approvals()  # tool calls waiting for the user's answer
        self._store = store
        self._meter = meter
        # Writes off the turn's path; None (no task group): they are awaited in place.
        self.writes = Writes(session_id, tasks) if tasks is not None else None
        self.metrics = metrics or Metrics()
        self._deferred: list[Frame] | None = None  # frames waiting for ``flush_frames``
        self._streamed: ChatMessage | None = None
        self.anchors: dict[str, Anchor] = {}  # route name -> the provider's last count on it
        self.stored = True  # False for a new session until its first message is stored
        self.owner: str | None = None  # the owning user's id (accounts); None: nobody's
        # Messages not yet in the store, in transcript order: a user's message on its way, replies
        # the store refused (written when it recovers).
        self.unsaved: dict[str, ChatMessage] = {}
        self.unsaved_calls: list[CallRecord] = []  # provider calls, written with the next save
        self.ledger = HistoryLedger(self._scan(), image_token_cost=image_token_cost)
        self.trimmed_tokens = self._count_trimmed()  # the meter's "History trimmed", kept current
        self._ids: set[str] = set()  # ids of transcript[:_ids_of] (``knows``)
        self._ids_of = 0

    @property
    def store(self) -> Store:
        if self._store is None:
            raise RuntimeError(f"session {self.id} was built without a store: it cannot save marks")
        return self._store

    @property
    def meter(self) -> Meter:
        if self._meter is None:
            raise RuntimeError(f"session {self.id} was built without a meter: it cannot read one")
        return self._meter

    # --- frames -------------------------------------------------------------------------------

    def emit(self, frame: Frame) -> Frame:
        if self._deferred is not None:  # a turn is about to call its provider (``defer_frames``)
            self._deferred.append(frame)
            return frame
        sent = self.channel.emit(frame)
        kind = sent["type"]
        if kind in WATCHED:  # not per chunk: the hot path pays one set lookup
            if kind in OBSERVED:
                self.notices.observe(sent, self._last_message_id(), utc_now())
            if kind in COUNTED:
                self.metrics.frame(sent)
        return sent

    def defer_frames(self) -> None:
        """Frames wait, in order, until ``flush_frames``: a turn's frames before its provider call
        (trims, meter, route) go out once the request has left, so neither their sending nor the
        send loop writing them delays the request."""
        if self._deferred is None:
            self._deferred = []

    def flush_frames(self) -> None:
        deferred, self._deferred = self._deferred, None
        for frame in deferred or ():
            self.emit(frame)

    def keep_notice(self, frame: Frame) -> None:
        """Keep a line the page drew without a frame of its own (a typed command) for a reload."""
        self.notices.keep(frame, self._last_message_id(), utc_now())

    async def save_notices(self) -> None:
        """Write the kept lines that wait; a session not stored yet keeps them until it is."""
        if self.stored:
            await self.notices.save(self.store, self.id)

    def _last_message_id(self) -> str | None:
        return self.transcript[-1].id if self.transcript else None

    @property
    def seq(self) -> int:
        return self.channel.seq

    @property
    def busy(self) -> bool:
        return self.turn is not None

    # --- the history --------------------------------------------------------------------------

    def _scan(self) -> list[ChatMessage]:
        """The sendable history read off the transcript: leading system messages, the breadcrumb
        when trimming or truncation left older turns out, then every message still visible, in
        transcript order. Linear in the transcript: it runs on load and after compaction, a
        set-aside or a retry, never per call (the ledger carries the history between those)."""
        transcript = self.transcript
        end = 0
        while end < len(transcript) and transcript[end].role == "system":
            end += 1
        system = [m for m in transcript[:end] if m.left_out is None]
        rest = transcript[end:]
        body = [m for m in rest if m.left_out is None and not m.breadcrumb]
        if self._streamed is not None and body and body[-1] is self._streamed:
            body.pop()  # the reply being written joins the ledger when it is complete
        # Turns set aside (refused, retried, orphaned) are not "omitted to fit the window".
        omitted = any(m.left_out in (TRIMMED, TRUNCATED) for m in rest)
        crumb = [self.breadcrumb] if omitted and body and not any(m.summary for m in body) else []
        return system + crumb + body

    def rebuild(self) -> None:
        """Re-read the ledger after marks changed outside a trim (compaction, restore, set-aside)."""
        self.ledger = HistoryLedger(self._scan(), image_token_cost=self.image_token_cost)
        self.trimmed_tokens = self._count_trimmed()
        self._forget_ids()  # compaction may have put a summary inside the transcript

    def _count_trimmed(self) -> int:
        trimmed = (m for m in self.transcript if m.left_out in (TRIMMED, TRUNCATED))
        return left_out_tokens(trimmed, self.image_token_cost)

    def to_send(self) -> list[ChatMessage]:
        """What the next provider call sends (the ledger keeps it and its estimate current)."""
        return self.ledger.messages()

    def add(self, *messages: ChatMessage) -> None:
        for message in messages:
            message.created_at = message.created_at or utc_now()
        self.transcript.extend(messages)
        self.ledger.extend(messages)

    def knows(self, message_id: str) -> bool:
        """A message of the transcript has ``message_id``. The ids are kept in a set as the
        transcript grows (a message refused for a used id is checked on every submit), read again
        from the start after anything but an append changed it (``_forget_ids``)."""
        transcript = self.transcript
        if self._ids_of > len(transcript):
            self._forget_ids()
        self._ids.update(message.id for message in transcript[self._ids_of:])
        self._ids_of = len(transcript)
        return message_id in self._ids

    def _forget_ids(self) -> None:
        self._ids, self._ids_of = set(), 0

    def snapshot(self) -> list[ChatMessage]:
        """The transcript as it stands, the reply being written included with its text so far."""
        if self.reply is not None:
            self.reply.current()
        return self.transcript

    # --- the reply being written --------------------------------------------------------------

    def join_reply(self, writer: ReplyWriter) -> None:
        """The reply's first piece: its message is in the transcript from now on, not yet sent."""
        message = writer.current()
        assert message is not None, "join_reply after the writer's first piece"
        message.created_at = message.created_at or utc_now()
        self.reply, self._streamed = writer, message
        self.transcript.append(message)

    def settle_reply(self, message: ChatMessage | None) -> None:
        """The reply is complete: ``message`` joins the ledger (and the transcript if it never
        streamed); None (nothing worth keeping) takes a streamed message back out."""
        streamed, self._streamed, self.reply = self._streamed, None, None
        if streamed is not None and streamed is not message:
            self.transcript.remove(streamed)
            self._forget_ids()
        if message is None:
            return
        message.created_at = message.created_at or utc_now()
        if streamed is None:
            self.transcript.append(message)
        self.ledger.append(message)

    @property
    def has_unsaved(self) -> bool:
        """Messages or provider calls wait for a write (on their way, or refused by the store)."""
        return bool(self.unsaved or self.unsaved_calls)

    async def save_reply(self, *messages: ChatMessage) -> None:
        """Write ``messages`` after every message still unsaved (the user's message whose write is
        on its way, replies the store refused before), in order, and the provider calls waiting,
        in one transaction. While the store is unavailable they stay in ``unsaved`` and
        ``unsaved_calls`` (in memory) and ``StoreUnavailable`` is raised; the next save that
        succeeds writes them all."""
        for message in messages:
            self.unsaved[message.id] = message
        pending = list(self.unsaved.values())
        if not pending and not self.unsaved_calls:
            return
        # Taken, not copied: a save running beside this one (the message's own) must not insert them too.
        calls, self.unsaved_calls = self.unsaved_calls, []
        try:
            await self.store.save_messages(self.id, pending, calls)
        except BaseException:
            self.unsaved_calls[:0] = calls
            raise
        for message in pending:
            if self.unsaved.get(message.id) is message:
                del self.unsaved[message.id]

    def store_soon(self, message: ChatMessage) -> None:
        """Write ``message`` (in the transcript already) without waiting for the store: it is
        ``unsaved`` until the write lands, so the reply's save writes it first if it has not."""
        self.unsaved[message.id] = message
        self._behind(self._save_quietly)

    async def _save_quietly(self) -> None:
        try:
            await self.save_reply()
        except StoreUnavailable:
            pass  # still unsaved: the turn's reply save tries again, and says so if it fails

    async def check_writes(self) -> None:
        """Wait for the background writes (held ones started now), then raise the
        ``StoreUnavailable`` of one the store refused (a trim's record; a refused message stays in
        ``unsaved`` instead)."""
        if self.writes is not None:
            await self.writes.check()

    def _behind(self, write: Callable[[], Awaitable[None]]) -> None:
        if self.writes is None:
            raise RuntimeError(f"session {self.id} was built without a task group: it writes in place")
        self.writes.start(write)

    # --- operations on the marks --------------------------------------------------------------

    async def trim(self, report: TrimReport, turn_id: str | None = None,
                   reading: Reading | None = None, budget: int | None = None) -> bool:
        """Mark what a trim dropped (kept in the transcript, no longer sent), store the marks and
        tell every client and observer with a ``history_trimmed`` frame. False when nothing was
        dropped. With ``reading``, the frame's token figures are the meter's (tools, calibration and
        reserve included), and ``budget`` the figure the trim aimed at."""
        dropped = [m for m in report.dropped if not m.breadcrumb]
        if not dropped:
            return False
        for message in dropped:
            message.left_out = TRIMMED
        left = left_out_tokens(dropped, self.image_token_cost)  # they were all sent
        self.trimmed_tokens += left
        for route, anchor in self.anchors.items():  # the counts move past what left the request
            self.anchors[route] = anchor.without(left)
        fields = {**report.frame_fields(), "dropped_messages": len(dropped)}
        if reading is not None and "tokens_before" in fields:
            fields["tokens_before"] = reading.history_figure(report.tokens_before)
            fields["tokens_after"] = reading.history_figure(report.tokens_after)
            if budget is not None:
                fields["token_budget"] = budget
        frame = server_frame("history_trimmed", **fields, **dropped_ids(dropped), turn_id=turn_id)
        await self.keep_trim(frame, dropped)  # the marks and the notice in one write
        self.emit(frame)
        return True

    async def keep_trim(self, frame: Frame, marked: Sequence[ChatMessage] = ()) -> None:
        """Store the trim with where it happened (its turn, or the last message before it), so a
        reload puts its notice back in place, with the ``marked`` messages it left out."""
        kept = {k: v for k, v in frame.items() if k not in ("type", "seq")}
        if frame.get("turn_id") is None:
            kept["after_message_id"] = self.transcript[-1].id if self.transcript else None
        kept["created_at"] = utc_now()
        self.trims.append(kept)
        if self.writes is None:
            await self.store.record_trim(self.id, kept, marked)
        else:  # off the turn's path; a refusal is raised by check_writes when the turn ends
            self._behind(lambda: self.store.record_trim(self.id, kept, marked))

    # --- the meter ----------------------------------------------------------------------------

    async def read_meter(self, route: Route, final: bool = False) -> Reading:
        """The reading of what the session would send to ``route`` now, anchored on its last count."""
        return await self.meter.read(route, self.ledger.estimate, self.meter.tools(route, final),
                                     self.anchors.get(route.name), self.ledger.tail())

    async def emit_meter(self, route: Route, reason: str, reading: Reading | None = None,
                         reported: int | None = None) -> Reading:
        """Send the ``context`` frame for ``route``: what the session would send now, or ``reported``."""
        if reading is None:
            reading = await self.read_meter(route)
        self.emit_reading(reason, reading, reported)
        return reading

    def emit_reading(self, reason: str, reading: Reading, reported: int | None = None) -> None:
        """The ``context`` frame of ``reading``, taken already (``emit_meter`` without the wait)."""
        self.emit(self.meter.frame(reading, self.ledger, reason, reported, self.trimmed_tokens))
