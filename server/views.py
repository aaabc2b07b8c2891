"""Wire views: how a session and its messages appear in ``session`` and ``history`` frames.

A message's view is what the page needs to draw it: long tool results are clipped here (the store
and the exports keep them whole), images are counted, not sent back.
"""

from __future__ import annotations

from typing import Any

from server.channel import Frame
from server.history import ChatMessage, stored_marks
from server.protocol import PROTOCOL_VERSION, server_frame
from server.session import Session

HISTORY_TOOL_CHARS = 8000


def display_text(message: ChatMessage) -> str:
    """A tool result as the ``history`` frame shows it: long outputs are clipped there (the store
    and the exports keep them whole), so reopening a long session stays quick."""
    text = message.content
    if message.role != "tool" or len(text) <= HISTORY_TOOL_CHARS:
        return text
    hidden = len(text) - HISTORY_TOOL_CHARS
    return f"{text[:HISTORY_TOOL_CHARS]}\n\n[... {hidden:,} more characters, in the session export ...]"


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


def history_frame(session: Session) -> Frame:
    messages = [message_view(m) for m in session.snapshot()]
    return {**server_frame("history", messages=messages), "seq": session.seq}
