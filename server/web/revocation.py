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
from collections.abc import Callable, Iterator
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
        self.logins: dict[str, set[Callable[[], None]]] = {}
        self.tokens: dict[str, set[Callable[[], None]]] = {}
        self.users: dict[str, set[Callable[[], None]]] = {}

    @contextmanager
    def track(self, viewer: Viewer, on_revoke: Callable[[], None] | None = None) -> Iterator[anyio.Event]:
        """An event set (and ``on_revoke`` called) when ``viewer``'s sign-in, API token or account is
        revoked, for as long as the block runs."""
        revoked = anyio.Event()
        if viewer.user is None:  # nobody signs in: nothing to revoke
            yield revoked
            return

        def revoke() -> None:
            revoked.set()
            if on_revoke is not None:
                on_revoke()

        table, key = self._table_of(viewer)
        table.setdefault(key, set()).add(revoke)
        try:
            yield revoked
        finally:
            callbacks = table.get(key, set())
            callbacks.discard(revoke)
            if not callbacks:
                table.pop(key, None)

    def _table_of(self, viewer: Viewer) -> tuple[dict[str, set[Callable[[], None]]], str]:
        assert viewer.user is not None
        if viewer.login:
            return self.logins, viewer.login
        if viewer.token:
            return self.tokens, viewer.token
        return self.users, viewer.user.id  # a proxy's header names the user: disabling is the revocation

    def revoke(self, login: str) -> None:
        for callback in self.logins.pop(login, set()):
            callback()

    async def run(self) -> None:
        while True:
            await anyio.sleep(self.interval)
            try:
                await self.check()
            except StoreUnavailable as exc:  # tried again next round; the sockets stay meanwhile
                log.warning("revocation check: %s", exc)

    async def check(self) -> None:
        """Revoke every tracked sign-in, token and user the store no longer vouches for."""
        for table, still_good in ((self.logins, self._live_logins), (self.tokens, self.store.live_tokens),
                                  (self.users, self.store.active_users)):
            keys = list(table)
            for start in range(0, len(keys), BATCH):
                batch = keys[start:start + BATCH]
                good = await still_good(batch)
                for key in set(batch) - good:
                    for callback in table.pop(key, set()):
                        callback()

    async def _live_logins(self, keys: list[str]) -> set[str]:
        return await self.store.live_logins(keys, utc_now())
