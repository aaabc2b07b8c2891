"""``Notices``: what the live page shows in the transcript besides messages and trims, kept so a
reload shows it again where it happened.

A session's frames pass ``observe``; the ones the page draws as a line of the transcript are kept:
a turn's ``error`` (its code, message and ``retryable``, so the reload offers "Try again" as the live
page did), every ``notice`` (an unknown hint, a learned window, a truncated reply...), a switch's
``context`` frame (the confirmation line is drawn from it), ``aborted`` (a turn stopped before its
reply began) and, through ``keep``, a typed ``/model`` command. Each is kept as the frame's fields
with ``created_at`` and ``after_message_id`` (the last message of the transcript when it happened:
where the page puts it back). The store writes them in order (``Store.record_notice``); until it
has (a session not stored yet, a store that refused), they wait in ``unsaved`` and the in-memory
list still answers a reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.errors import StoreUnavailable, UnknownSession
from server.store import Store

Notice = dict[str, Any]
# A reload gets this many of a session's newest notices: a page of lines, not an unbounded frame.
NOTICES_SHOWN = 200


def kept_kind(frame: Mapping[str, Any]) -> bool:
    """Whether the page draws ``frame`` as a line of the transcript worth drawing again."""
    kind = frame.get("type")
    if kind == "error":
        return frame.get("turn_id") is not None  # a socket's refusal is that socket's, not the session's
    if kind == "context":
        return frame.get("reason") == "switch"
    return kind in ("notice", "aborted")


class Notices:
    def __init__(self, kept: list[Notice] | None = None) -> None:
        self.kept = kept if kept is not None else []
        self.unsaved: list[Notice] = []

    def observe(self, frame: Mapping[str, Any], after: str | None, now: str) -> None:
        if kept_kind(frame):
            self.keep(frame, after, now)

    def keep(self, frame: Mapping[str, Any], after: str | None, now: str) -> None:
        notice = {k: v for k, v in frame.items() if k != "seq"}
        notice.update(created_at=now, after_message_id=after)
        self.kept.append(notice)
        self.unsaved.append(notice)

    def shown(self) -> list[Notice] | None:
        return self.kept[-NOTICES_SHOWN:] or None

    async def save(self, store: Store, session_id: str) -> None:
        """Write what waits, oldest first; a store that refuses keeps the rest for the next call,
        a session deleted meanwhile drops them."""
        while self.unsaved:
            try:
                await store.record_notice(session_id, self.unsaved[0])
            except StoreUnavailable:
                return
            except UnknownSession:
                self.unsaved.clear()
                return
            self.unsaved.pop(0)
