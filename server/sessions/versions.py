"""Versions of a turn: a user message that replaces an earlier turn, and what that sets aside.

``retry_of`` replaces one turn (a failed turn, a regenerated reply, an edit of the last message);
``edit_of`` is an edit of an earlier message: that turn and every turn after it are set aside. Either
way the replaced turns stay in the transcript, no longer sent; the new user message records the turn
it replaces (``ChatMessage.replaces``) so a reload and every other tab can show the versions, and
every tab is told which turns left the context (``turns_set_aside``).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import BadFrame
from server.protocol import ID_CHARS, echo, server_frame
from server.sessions.session import Session
from server.sessions.set_aside import set_aside, set_aside_from, turns_from

RETRIED = "replaced by a retry"  # the same question again after a failed or stopped reply
REGENERATED = "replaced by a regenerated reply"  # the same question again after a complete reply
EDITED = "replaced by an edit"  # another text in its place


def retry_reason(session: Session, turn_id: str, text: str) -> str:
    """Why a ``retry_of`` replaced its turn, read off the turn, so every tab and a reload say what
    the tab that sent it said."""
    turn = [m for m in session.transcript if m.turn_id == turn_id]
    asked = next((m.content for m in turn if m.role == "user"), text)
    if asked != text:
        return EDITED
    replies = [m for m in turn if m.role == "assistant"]
    return REGENERATED if replies and not replies[-1].interrupted else RETRIED


def checked_turn_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= ID_CHARS:
        raise BadFrame(f"{name}: expected a turn_id string, got {echo(value)}")
    return value


@dataclass(frozen=True)
class Replaces:
    turn_id: str
    edit: bool  # edit_of: the turn and every later one; retry_of: the turn alone

    checked = staticmethod(checked_turn_id)

    @classmethod
    def of(cls, session: Session, retry_of: object, edit_of: object) -> Replaces | None:
        """What a ``message`` frame replaces, checked before anything changes."""
        if retry_of is not None and edit_of is not None:
            raise BadFrame("message: retry_of and edit_of name the turn to replace; send one of them")
        if edit_of is not None:
            turn_id = checked_turn_id("message.edit_of", edit_of)
            if not turns_from(session, turn_id):
                raise BadFrame(f"message.edit_of: no turn {echo(turn_id)} in this session")
            return cls(turn_id, edit=True)
        if retry_of is not None:
            return cls(checked_turn_id("message.retry_of", retry_of), edit=False)
        return None

    async def set_aside(self, session: Session, text: str) -> list[str]:
        """Set the replaced turns aside and tell every tab; the turns that left the context.
        ``text`` is the replacing message's (a retry with another text is an edit)."""
        reason = EDITED if self.edit else retry_reason(session, self.turn_id, text)
        if self.edit:
            turns = await set_aside_from(session, self.turn_id, reason)
        elif await set_aside(session, self.turn_id, reason):
            turns = [self.turn_id]
        else:
            raise BadFrame(f"message.retry_of: no turn {echo(self.turn_id)} still sent in this session")
        if turns:
            session.emit(server_frame("turns_set_aside", turn_ids=turns, reason=reason))
        return turns

    def echo(self) -> dict[str, str]:
        """The field the ``accepted`` frame repeats, so every tab links the versions."""
        return {"edit_of" if self.edit else "retry_of": self.turn_id}
