"""A stored session opened again: what it needs before its first client sees it.

It takes the route it was stored with, or the default when that route is no longer configured.
Tool calls whose result is missing are set aside, unless (live mode) another instance holds the
session's turn lease and may be running the tool right now. The turn limit is applied when the
first client opens it, and the trim that makes is announced to that client (a ``restore`` meter
frame in place of the ``hello`` one).
"""

from __future__ import annotations

import logging

from server.errors import UnknownRoute
from server.routing.resolver import Route
from server.sessions.instances import Instances
from server.sessions.runtime import Runtime
from server.sessions.session import Session
from server.sessions.set_aside import set_aside_orphans

log = logging.getLogger(__name__)


class Restores:
    """The sessions restored here whose restore trim no client has been shown yet."""

    def __init__(self, rt: Runtime, instances: Instances) -> None:
        self.rt = rt
        self.instances = instances
        self._pending: set[str] = set()

    def route(self, name: str) -> Route:
        """The route a session was stored with, or the default when it is gone from the config."""
        default = self.rt.resolver.default_route()
        if not name or name == default.name:
            return default
        try:
            return self.rt.resolver.parse(name, kind="switch")
        except UnknownRoute:
            log.warning("stored route %s is no longer configured; using %s", name, default.name)
            return default

    async def restored(self, session: Session) -> None:
        """``session`` was just read from the store."""
        # A tool call whose result is missing may be one another instance is running right now.
        if not await self.instances.turn_running(session.id):
            await set_aside_orphans(session)
        self._pending.add(session.id)

    def forget(self, session_id: str) -> None:
        self._pending.discard(session_id)

    async def announce(self, session: Session) -> bool:
        """Apply the turn limit once after a restore and announce its trim; True when it trimmed
        (the ``restore`` meter frame then stands for the ``hello`` one)."""
        if session.id not in self._pending:
            return False
        self._pending.discard(session.id)
        report = session.ledger.trim_turn_count(self.rt.options.turn_limit)
        if not await session.trim(report):
            return False
        await session.emit_meter(session.route, "restore")
        return True
