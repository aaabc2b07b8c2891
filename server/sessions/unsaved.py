"""Messages and notices the store refused (``Session.unsaved``, ``Notices.unsaved``), written again.

A turn the store failed under keeps its reply (and its user's message, when that write failed too)
in memory. ``UnsavedWriter`` tries them again every ``UNSAVED_RETRY_SECONDS`` until the store takes
them, then tells the session's clients
(``store_recovered``); a newer turn writes it first too, so whichever succeeds first empties
``unsaved``. At shutdown each session gets one last try.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from server.errors import StoreUnavailable
from server.protocol import server_frame
from server.sessions.session import Session

log = logging.getLogger(__name__)

UNSAVED_RETRY_SECONDS = 1.0  # how often a reply the store refused is tried again


class UnsavedWriter:
    def __init__(self, spawn: Callable[..., None]) -> None:
        self.spawn = spawn
        self._retrying: set[str] = set()  # sessions whose refused replies are being retried

    def after_turn(self, session: Session) -> None:
        """A turn ended: retry what the store refused, in one background task per session."""
        if (session.has_unsaved or session.notices.unsaved) and session.id not in self._retrying:
            self._retrying.add(session.id)
            self.spawn(self._write, session)

    async def _write(self, session: Session) -> None:
        """Try the replies (and notices) the store refused again until it takes them, then say so."""
        try:
            while session.has_unsaved or session.notices.unsaved:
                await anyio.sleep(UNSAVED_RETRY_SECONDS)
                if session.has_unsaved:
                    try:
                        await session.save_reply()
                    except StoreUnavailable:
                        continue
                    session.emit(server_frame("notice", code="store_recovered", message=(
                        "the session store is writable again: what it refused is now saved")))
                await session.save_notices()  # the turn's error line, refused with the reply
        finally:
            self._retrying.discard(session.id)

    async def last_try(self, session: Session) -> None:
        """The server is shutting down: write what the store refused once more, or log its loss."""
        if not session.has_unsaved:
            return
        try:
            await session.save_reply()
        except StoreUnavailable:
            log.error("session %s: %d reply(s) not written, the store still refuses writes at shutdown",
                      session.id, len(session.unsaved))
