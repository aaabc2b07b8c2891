"""Setting turns aside: their messages stay in the session's transcript (a reload shows them) but
are no longer sent (``left_out`` holds why), and the store keeps the marks.

A retry or an edit of the last message sets its turn aside (``set_aside``); an edit of an earlier
message sets that turn and every later one aside (``set_aside_from``, previewed by
``estimate_without``); a turn whose reply cannot fit the window is set aside by the turn itself; and
on restore, tool messages whose call or result is missing stop being sent (``set_aside_orphans``).
"""

from __future__ import annotations

from server.history.messages import ChatMessage, estimate_history_tokens
from server.history.trim import sweep_orphans
from server.sessions.session import Session

ORPHANED = "orphaned tool message (its call or result is missing)"


async def set_aside(session: Session, turn_id: str, reason: str) -> list[ChatMessage]:
    """Keep a turn's messages in the transcript but stop sending them (``left_out`` =
    ``reason``); returns what was set aside (nothing when the turn is unknown or already left out)."""
    messages = [m for m in session.transcript if m.turn_id == turn_id and m.left_out is None]
    return await _leave_out(session, messages, reason)


def turns_from(session: Session, turn_id: str) -> list[str]:
    """``turn_id`` and every turn after it, in transcript order (empty when it is unknown)."""
    turns = list(dict.fromkeys(m.turn_id for m in session.transcript if m.turn_id))
    return turns[turns.index(turn_id):] if turn_id in turns else []


async def set_aside_from(session: Session, turn_id: str, reason: str) -> list[str]:
    """An edit of an earlier message: that turn and every later one stop being sent (kept in
    the transcript); returns the turns that were still sent and are now set aside."""
    turns = turns_from(session, turn_id)
    messages = [m for m in session.transcript if m.turn_id in turns and m.left_out is None]
    await _leave_out(session, messages, reason)
    return [t for t in turns if any(m.turn_id == t for m in messages)]


def estimate_without(session: Session, turn_ids: list[str]) -> int:
    """The estimate of what would be sent with ``turn_ids`` left out (an edit's preview)."""
    gone = set(turn_ids)
    kept = [m for m in session.to_send() if m.turn_id not in gone]
    return estimate_history_tokens(kept, session.image_token_cost)


async def set_aside_orphans(session: Session) -> list[ChatMessage]:
    """On restore: tool messages whose call or result is missing are no longer sent."""
    swept = {m.id for m in sweep_orphans(session.to_send())}
    orphans = [m for m in session.to_send() if m.id not in swept and not m.breadcrumb]
    return await _leave_out(session, orphans, ORPHANED)


async def _leave_out(session: Session, messages: list[ChatMessage], reason: str) -> list[ChatMessage]:
    for message in messages:
        message.left_out = reason
    if messages:
        session.rebuild()
        await session.store.save_messages(session.id, messages)
    return messages
