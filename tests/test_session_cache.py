"""server.sessions.cache: opening one session never waits on another's load from the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from server.routing.resolver import RouteResolver
from server.sessions.cache import SessionCache
from server.sessions.events import EventBus
from server.sessions.hub import SessionHub
from server.sessions.runtime import Runtime
from server.store.base import StoredSession
from server.store.sqlite import SqliteStore
from tests.support import settings_for

pytestmark = pytest.mark.anyio


SLOW_ID = "slow000000000000"


class SlowStore(SqliteStore):
    """The real store, holding ``SLOW_ID`` and one other session; reading ``SLOW_ID`` waits for
    ``release``, so a test can act while that read is on its way."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.reading = anyio.Event()  # the slow read has begun
        self.release = anyio.Event()  # ... and may end
        self.reads: list[str] = []  # every session read

    async def get_session(self, session_id: str) -> StoredSession | None:
        self.reads.append(session_id)
        if session_id == SLOW_ID:
            self.reading.set()
            await self.release.wait()
        return await super().get_session(session_id)


@asynccontextmanager
async def cache_over_slow_store(tmp_path: Path) -> AsyncIterator[tuple[SessionCache, SlowStore]]:
    settings = settings_for(tmp_path)
    store = SlowStore.open(tmp_path / "data")
    for session_id in (SLOW_ID, "other0000000000a"):
        await store.create_session(session_id, title="stored", route="demo")
    try:
        async with anyio.create_task_group() as tasks:
            hub = SessionHub(Runtime(settings, store, {}, RouteResolver(settings, {}), EventBus(), tasks))
            yield hub.cache, store
            tasks.cancel_scope.cancel()
    finally:
        await store.close()


async def test_session_cache_opens_others_while_one_loads(tmp_path):
    async with cache_over_slow_store(tmp_path) as (cache, slow), anyio.create_task_group() as tasks:
        opened = {}

        async def open_slow() -> None:
            opened[SLOW_ID] = await cache.open(SLOW_ID)

        tasks.start_soon(open_slow)
        await slow.reading.wait()
        with anyio.fail_after(5):
            fresh = await cache.open(None)
            other = await cache.open("other0000000000a")
        assert fresh.id not in (SLOW_ID, other.id) and other.id == "other0000000000a"
        assert SLOW_ID not in opened
        slow.release.set()
    assert opened[SLOW_ID].id == SLOW_ID


async def test_session_cache_one_session_opened_twice_at_once_is_read_once(tmp_path):
    async with cache_over_slow_store(tmp_path) as (cache, slow), anyio.create_task_group() as tasks:
        opened = []

        async def open_slow() -> None:
            opened.append(await cache.open(SLOW_ID))

        tasks.start_soon(open_slow)
        tasks.start_soon(open_slow)
        await slow.reading.wait()
        slow.release.set()
    assert slow.reads == [SLOW_ID] and len(opened) == 2 and opened[0] is opened[1]
    assert not len(cache._opening)  # nothing kept once nobody opens
