"""``KeyedLock``: one lock per key (a session id, a provider's model), kept only while a task holds
or awaits it, so the map stays as small as the work in flight.

The locks take a free lock without yielding to the loop (anyio's ``fast_acquire``): under load a
loop iteration runs hundreds of callbacks, and a lock that yields on every acquire, or one shared by
every key, queues its users one iteration each (docs/performance.md, "Opening under load").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

import anyio


class KeyedLock:
    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[anyio.Lock, int]] = {}

    def __len__(self) -> int:
        """The keys a task holds or awaits."""
        return len(self._locks)

    @asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (anyio.Lock(fast_acquire=True), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks.pop(key)
            if users > 1:
                self._locks[key] = (lock, users - 1)
