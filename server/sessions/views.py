"""Wire views: how a session and its messages appear in ``session`` and ``history`` frames.

A message's view is what the page needs to draw it as the live page showed it: long tool results
are clipped here (the store and the exports keep them whole); images are URLs to fetch
(``image_url``), never inlined; each reply carries its turn's route, and the turn's last reply its
usage and cost (joined from the calls the store records per turn; a reply whose turn is still in its
first call takes the route of that call's ``route`` frame; a reply whose call was never recorded,
stopped, failed or cut short by a crash, the route it kept itself, ``served_by``, which also gives a
hinted reply its hint back); a reply still being written is marked
``streaming``. The ``history`` frame also carries the session's trims and its other lines
(errors, notices, switches: ``server.sessions.notices``), so they come back where they happened.

History goes out in pages, newest first: the ``history`` snapshot carries the newest messages (at
most ``server.history_page_messages``, and about ``HISTORY_PAGE_BYTES`` of text) and says how many
are ``older``; a client asks for those with ``history_before`` and gets a ``history_page``. So a huge
session never becomes one frame, and one huge message is clipped to a page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from server.history.messages import ChatMessage, stored_marks
from server.protocol import PROTOCOL_VERSION, server_frame
from server.sessions.channel import Frame
from server.sessions.session import Session
from server.store.base import CallRecord

HISTORY_TOOL_CHARS = 8000
HISTORY_PAGE_BYTES = 1024 * 1024  # text per page; a single longer message is clipped to it
# The wire spelling of a turn's summed calls; ``calls`` says how many were summed.
Usage = dict[str, Any]


def display_text(message: ChatMessage) -> str:
    """A message as the ``history`` frame shows it: long tool outputs, and any message longer than
    a page, are clipped there (the store and the exports keep them whole), so reopening a long
    session stays quick."""
    text = message.content
    keep = _shown_chars(message)
    if len(text) <= keep:
        return text
    hidden = len(text) - keep
    return f"{text[:keep]}\n\n[... {hidden:,} more characters, in the session export ...]"


def _shown_chars(message: ChatMessage) -> int:
    return HISTORY_TOOL_CHARS if message.role == "tool" else HISTORY_PAGE_BYTES


def image_url(session_id: str, message_id: str, index: int) -> str:
    """Where the page fetches an attached image (``server.sessions.images.image_endpoint`` serves it)."""
    return f"/api/sessions/{quote(session_id, safe='')}/images/{quote(message_id, safe='')}/{index}"


def image_urls(session_id: str, message: ChatMessage) -> list[str] | None:
    if not message.images:
        return None
    return [image_url(session_id, message.id, n) for n in range(len(message.images))]


def message_view(message: ChatMessage, session_id: str = "") -> dict[str, Any]:
    trimmed, excluded = stored_marks(message)
    view: dict[str, Any] = {
        "id": message.id, "role": message.role, "content": display_text(message), "trimmed": trimmed,
        "interrupted": message.interrupted, "summary": message.summary, "breadcrumb": message.breadcrumb,
    }
    optional = {"turn_id": message.turn_id, "excluded": excluded, "tool_call_id": message.tool_call_id,
                "name": message.name, "created_at": message.created_at, "replaces": message.replaces,
                "thinking": message.thinking}
    view.update({k: v for k, v in optional.items() if v})
    if message.tool_calls:
        view["tool_calls"] = [{"id": c.id, "name": c.name, "args": c.arguments} for c in message.tool_calls]
    if message.role == "tool":  # its size as recorded, though ``content`` may be clipped here
        view["tokens"] = message.text_tokens
    if message.images:
        view["images"] = len(message.images)
        view["image_urls"] = image_urls(session_id, message)
    return view


def turn_usage(calls: Iterable[CallRecord]) -> dict[str, tuple[dict[str, str], Usage]]:
    """turn_id -> (its route, its summed usage), the figures the live ``route`` and ``done`` gave."""
    turns: dict[str, tuple[dict[str, str], Usage]] = {}
    for call in calls:
        if call.turn_id is None:
            continue
        route = {"provider": call.provider, "model": call.model, "route_kind": call.route_kind}
        _, usage = turns.get(call.turn_id, (route, {"input_tokens": 0, "output_tokens": 0, "calls": 0}))
        usage["input_tokens"] += call.input_tokens
        usage["output_tokens"] += call.output_tokens
        usage["last_input_tokens"] = call.input_tokens
        usage["calls"] += 1
        if call.cost_usd is not None:
            usage["cost_usd"] = usage.get("cost_usd", 0.0) + call.cost_usd
        turns[call.turn_id] = (route, usage)
    return turns


def _last_replies(messages: list[ChatMessage]) -> dict[str, ChatMessage]:
    """turn_id -> the turn's last assistant message (the one its ``done`` finished)."""
    return {m.turn_id: m for m in messages if m.role == "assistant" and m.turn_id}


def transcript_views(session: Session, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    """Views of ``messages[start:end]`` of the snapshot (routes and usage joined over all of it)."""
    messages = session.snapshot()
    streaming = session.reply.current() if session.reply is not None else None
    running = session.turn.turn_id if session.turn is not None else None
    usage = turn_usage(session.calls)
    live_route = session.notices.route_of(running)  # a reply whose first call has not ended yet
    last = _last_replies(messages)
    views = []
    for message in messages[start:end]:
        view = message_view(message, session.id)
        if message is streaming:
            view["streaming"] = True  # still being written: "interrupted" until it ends, as stored
        if message.role == "assistant" and message.turn_id in usage:
            route, summed = usage[message.turn_id]
            # A turn keeps its route for all its calls; the reply's own says the hint as well.
            view["route"] = message.served_by.fields() if message.served_by else route
            finished = message.turn_id != running and not message.interrupted
            if finished and last[message.turn_id] is message:
                view["usage"] = summed
        elif message.role == "assistant" and live_route and message.turn_id == running:
            view["route"] = live_route
        elif message.role == "assistant" and message.served_by is not None:  # no call recorded
            view["route"] = message.served_by.fields()
        views.append(view)
    return views


def session_frame(session: Session, *, resumed: bool, seq: int, routes: list[str]) -> Frame:
    frame = server_frame("session", session_id=session.id, resumed=resumed,
                         message_count=len(session.transcript), route=session.route.name,
                         routes=routes, title=session.title, protocol=PROTOCOL_VERSION)
    return {**frame, "seq": seq}


def page_start(messages: list[ChatMessage], end: int, limit: int) -> int:
    """Where the page ending before index ``end`` starts: at most ``limit`` messages (at least one)
    and, past the first, no more than a page of text."""
    start, size = end, 0
    while start > 0 and end - start < max(1, limit) and (start == end or size < HISTORY_PAGE_BYTES):
        start -= 1
        size += min(len(messages[start].content), _shown_chars(messages[start]))
    return start


def history_frame(session: Session, page: int) -> Frame:
    """The snapshot: the newest page of the transcript (the reply being written included)."""
    running = session.turn.turn_id if session.turn is not None else None
    messages = session.snapshot()
    start = page_start(messages, len(messages), page)
    frame = server_frame("history", messages=transcript_views(session, start), older=start or None,
                         trims=list(session.trims) or None, notices=session.notices.shown(),
                         turn_in_flight=running, approvals=session.approvals.frames() or None)
    return {**frame, "seq": session.seq}


def history_page_frame(session: Session, before_id: str, limit: int) -> Frame:
    """The page before message ``before_id`` (empty when the session does not hold that id)."""
    messages = session.snapshot()
    end = next((i for i, m in enumerate(messages) if m.id == before_id), 0)
    start = page_start(messages, end, limit)
    return server_frame("history_page", before_id=before_id, messages=transcript_views(session, start, end),
                        older=start)
