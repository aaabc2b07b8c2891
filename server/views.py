"""Wire views: how a session and its messages appear in ``session`` and ``history`` frames.

A message's view is what the page needs to draw it: long tool results are clipped here (the store
and the exports keep them whole), images are counted, not sent back.

History goes out in pages, newest first: the ``history`` snapshot carries the newest messages (at
most ``history_page_messages``, and about ``history_page_bytes`` of text) and says how many are
``older``; a client asks for those with ``history_before`` and gets a ``history_page``. So a huge
session never becomes one frame, and one huge message is clipped to a page.
"""

from __future__ import annotations

from typing import Any

from server.channel import Frame
from server.history import ChatMessage, stored_marks
from server.protocol import PROTOCOL_VERSION, server_frame
from server.session import Session

HISTORY_TOOL_CHARS = 8000
HISTORY_PAGE_BYTES = 1024 * 1024  # text per page; a single longer message is clipped to it


def display_text(message: ChatMessage) -> str:
    """A message as the ``history`` frame shows it: long tool outputs, and any message longer than
    a page, are clipped there (the store and the exports keep them whole), so reopening a long
    session stays quick."""
    text = message.content
    keep = HISTORY_TOOL_CHARS if message.role == "tool" else HISTORY_PAGE_BYTES
    if len(text) <= keep:
        return text
    hidden = len(text) - keep
    return f"{text[:keep]}\n\n[... {hidden:,} more characters, in the session export ...]"


def message_view(message: ChatMessage) -> dict[str, Any]:
    trimmed, excluded = stored_marks(message)
    view: dict[str, Any] = {
        "id": message.id, "role": message.role, "content": display_text(message), "trimmed": trimmed,
        "interrupted": message.interrupted, "summary": message.summary, "breadcrumb": message.breadcrumb,
    }
    if message.turn_id:
        view["turn_id"] = message.turn_id
    if excluded:
        view["excluded"] = excluded
    if message.tool_calls:
        view["tool_calls"] = [{"id": c.id, "name": c.name, "args": c.arguments} for c in message.tool_calls]
    if message.tool_call_id:
        view["tool_call_id"] = message.tool_call_id
    if message.name:
        view["name"] = message.name
    if message.images:
        view["images"] = len(message.images)
    return view


def session_frame(session: Session, *, resumed: bool, seq: int, routes: list[str]) -> Frame:
    frame = server_frame("session", session_id=session.id, resumed=resumed,
                         message_count=len(session.transcript), route=session.route.name,
                         routes=routes, title=session.title, protocol=PROTOCOL_VERSION)
    return {**frame, "seq": seq}


def page_before(messages: list[ChatMessage], end: int, limit: int) -> tuple[list[dict[str, Any]], int]:
    """Views of the messages before index ``end``, newest first until ``limit`` messages or a page
    of text, returned oldest first, and how many older ones remain."""
    views: list[dict[str, Any]] = []
    size = 0
    start = end
    while start > 0 and len(views) < max(1, limit) and (not views or size < HISTORY_PAGE_BYTES):
        start -= 1
        view = message_view(messages[start])
        size += len(view["content"])
        views.append(view)
    views.reverse()
    return views, start


def history_frame(session: Session, page: int) -> Frame:
    """The snapshot: the newest page of the transcript (the reply being written included)."""
    messages = session.snapshot()
    views, older = page_before(messages, len(messages), page)
    return {**server_frame("history", messages=views, older=older or None), "seq": session.seq}


def history_page_frame(session: Session, before_id: str, limit: int) -> Frame:
    """The page before message ``before_id`` (none when the session does not hold that id)."""
    messages = session.snapshot()
    end = next((i for i, m in enumerate(messages) if m.id == before_id), 0)
    views, older = page_before(messages, end, limit)
    return server_frame("history_page", before_id=before_id, messages=views, older=older)
