"""``Notices``: what the live page shows in the transcript besides messages and trims, kept so a
reload shows it again where it happened.

A session's frames pass ``observe``; the ones the page draws as a line of the transcript are kept:
a turn's ``error`` (its code, message and ``retryable``, so the reload offers "Try again" as the live
page did), every ``notice`` (an unknown hint, a learned window, a truncated reply...), a switch's
``context`` frame (the confirmation line is drawn from it), ``aborted`` (a turn stopped before its
reply began, or stopped in the middle of it), a ``route`` frame that names a hint (the reply's "served
by" says so; the calls the store records do not), and, through ``keep``, a typed ``/model`` command. A
turn's ``error`` and ``aborted`` carry the turn's ``route`` too, since a call that failed or was
stopped is not recorded; ``route_of`` gives a running turn's route for a reply still being written.
Each is kept as the frame's fields with ``created_at`` and ``after_message_id`` (the last message of
the transcript when it happened: where the page puts it back). The store writes them in order
(``Store.record_notice``); until it has (a session not stored yet, a store that refused), they wait
in ``unsaved`` and the in-memory list still answers a reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio

from server.errors import StoreUnavailable, UnknownSession
from server.store.base import Store

Notice = dict[str, Any]
# A reload gets this many of a session's newest notices: a page of lines, not an unbounded frame.
NOTICES_SHOWN = 200
ROUTE_FIELDS = ("provider", "model", "route_kind", "hint")


# The frame types ``observe`` looks at; every other frame (a chunk above all) passes untouched.
OBSERVED = frozenset(("error", "notice", "context", "route", "aborted"))


def kept_kind(frame: Mapping[str, Any]) -> bool:
    """Whether the page draws ``frame`` as a line of the transcript worth drawing again."""
    kind = frame.get("type")
    if kind == "error":
        return frame.get("turn_id") is not None  # a socket's refusal is that socket's, not the session's
    if kind == "context":
        return frame.get("reason") == "switch"
    if kind == "route":
        return bool(frame.get("hint"))
    return kind in ("notice", "aborted")


class Notices:
    def __init__(self, kept: list[Notice] | None = None) -> None:
        self.kept = (kept or [])[-NOTICES_SHOWN:]  # memory holds what a reload shows; the store all
        self.unsaved: list[Notice] = []
        self._route: Mapping[str, Any] = {}  # the last route frame: which route a failing turn had
        self._writing = anyio.Lock()

    def observe(self, frame: Mapping[str, Any], after: str | None, now: str) -> None:
        if frame.get("type") == "route":
            self._route = frame
        if not kept_kind(frame):
            return
        notice = self.keep(frame, after, now)
        route = self.route_of(frame["turn_id"]) if frame["type"] in ("error", "aborted") else None
        if route:
            notice["route"] = route
            if self._route.get("created_at"):  # when that call began: the reply's time after a reload
                route["created_at"] = self._route["created_at"]

    def route_of(self, turn_id: str | None) -> dict[str, Any] | None:
        """The route of turn ``turn_id``'s current call, as its last ``route`` frame named it (None
        before the turn's first call)."""
        if turn_id is None or self._route.get("turn_id") != turn_id:
            return None
        return {k: v for k, v in self._route.items() if k in ROUTE_FIELDS and v is not None}

    def keep(self, frame: Mapping[str, Any], after: str | None, now: str) -> Notice:
        notice = {k: v for k, v in frame.items() if k != "seq"}
        notice.update(created_at=frame.get("created_at") or now, after_message_id=after)  # a frame's own time
        self.kept.append(notice)
        del self.kept[:-NOTICES_SHOWN]
        self.unsaved.append(notice)
        return notice

    def shown(self) -> list[Notice] | None:
        return list(self.kept) or None

    async def save(self, store: Store, session_id: str) -> None:
        """Write what waits, oldest first; a store that refuses keeps the rest for the next call,
        a session deleted meanwhile drops them. One writer at a time (a switch can land while a
        turn ends), so each is written once and in order."""
        async with self._writing:
            while self.unsaved:
                try:
                    await store.record_notice(session_id, self.unsaved[0])
                except StoreUnavailable:
                    return
                except UnknownSession:
                    self.unsaved.clear()
                    return
                self.unsaved.pop(0)
