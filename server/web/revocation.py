"""``Revocations``: open sockets closed (4401) soon after their sign-in stops being good.

A request is checked against the store each time it comes; a socket is checked once, at its
handshake, and then lives for hours. So every open socket of a signed-in user is tracked here by
its sign-in (or, signed in by a proxy or an API token, by its user), and one task per process asks
the store every ``[auth] revocation_check_ms`` which of them are still good: one query for all the
sockets of the process, whatever their number, and it sees a sign-out, a disabled user or a changed
password made on any instance or by ``meterchat users`` (they all write the store). A sign-out on
this instance is also told at once (``revoke``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import anyio

from server.accounts.viewer import Viewer
from server.errors import StoreUnavailable
from server.store.base import Store
from server.store.users import utc_now

log = logging.getLogger(__name__)
BATCH = 500  # keys per query: far below any database's parameter limit


class Revocations:
    def __init__(self, store: Store, interval_seconds: float) -> None:
        self.store = store
        self.interval = interval_seconds
        self.logins: dict[str, set[anyio.Event]] = {}
        self.users: dict[str, set[anyio.Event]] = {}

    @contextmanager
    def track(self, viewer: Viewer) -> Iterator[anyio.Event]:
        """An event set when ``viewer``'s sign-in is revoked, for as long as the block runs."""
        revoked = anyio.Event()
        if viewer.user is None:  # nobody signs in: nothing to revoke
            yield revoked
            return
        table, key = (self.logins, viewer.login) if viewer.login else (self.users, viewer.user.id)
        table.setdefault(key, set()).add(revoked)
        try:
            yield revoked
        finally:
            events = table.get(key, set())
            events.discard(revoked)
            if not events:
                table.pop(key, None)

    def revoke(self, login: str) -> None:
        for event in self.logins.pop(login, set()):
            event.set()

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            try:
                await self.check()
            except StoreUnavailable as exc:  # tried again next round; the sockets stay meanwhile
                log.warning("revocation check: %s", exc)

    async def check(self) -> None:
        """Revoke every tracked sign-in and user the store no longer vouches for."""
        for table, still_good in ((self.logins, self._live_logins), (self.users, self.store.active_users)):
            keys = list(table)
            for start in range(0, len(keys), BATCH):
                batch = keys[start:start + BATCH]
                good = await still_good(batch)
                for key in set(batch) - good:
                    for event in table.pop(key, set()):
                        event.set()

    async def _live_logins(self, keys: list[str]) -> set[str]:
        return await self.store.live_logins(keys, utc_now())
