"""server.sessions.cache: opening one session never waits on another's load from the store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest

from server.routing.resolver import RouteResolver
from server.sessions.cache import SessionCache
from server.sessions.events import EventBus
from server.sessions.hub import SessionHub
from server.sessions.runtime import Runtime
from server.store.backends import open_store
from server.store.base import StoredSession
from tests.support import settings_for

pytestmark = pytest.mark.anyio


@dataclass
class SlowStore:
    reading: anyio.Event = field(default_factory=anyio.Event)  # the slow read has begun
    release: anyio.Event = field(default_factory=anyio.Event)  # ... and may end
    reads: list[str] = field(default_factory=list)  # every session read


@asynccontextmanager
async def cache_over_slow_store(tmp_path: Path,
                                slow_id: str) -> AsyncIterator[tuple[SessionCache, SlowStore]]:
    """A hub's cache whose store holds ``slow_id`` and another session; reading ``slow_id`` waits
    for ``release``."""
    settings = settings_for(tmp_path)
    store = open_store(tmp_path / "data")
    for session_id in (slow_id, "other0000000000a"):
        await store.create_session(session_id, title="stored", route="demo")
    slow = SlowStore()
    get_session = store.get_session

    async def slow_get_session(session_id: str) -> StoredSession | None:
        slow.reads.append(session_id)
        if session_id == slow_id:
            slow.reading.set()
            await slow.release.wait()
        return await get_session(session_id)

    store.get_session = slow_get_session  # type: ignore[method-assign]
    try:
        async with anyio.create_task_group() as tasks:
            hub = SessionHub(Runtime(settings, store, {}, RouteResolver(settings, {}), EventBus(), tasks))
            yield hub.cache, slow
            tasks.cancel_scope.cancel()
    finally:
        await store.close()


async def test_session_cache_opens_others_while_one_loads(tmp_path):
    slow_id = "slow000000000000"
    async with cache_over_slow_store(tmp_path, slow_id) as (cache, slow), anyio.create_task_group() as tasks:
        opened = {}

        async def open_slow() -> None:
            opened[slow_id] = await cache.open(slow_id)

        tasks.start_soon(open_slow)
        await slow.reading.wait()
        with anyio.fail_after(5):
            fresh = await cache.open(None)
            other = await cache.open("other0000000000a")
        assert fresh.id not in (slow_id, other.id) and other.id == "other0000000000a"
        assert slow_id not in opened
        slow.release.set()
    assert opened[slow_id].id == slow_id


async def test_session_cache_one_session_opened_twice_at_once_is_read_once(tmp_path):
    slow_id = "slow000000000000"
    async with cache_over_slow_store(tmp_path, slow_id) as (cache, slow), anyio.create_task_group() as tasks:
        opened = []

        async def open_slow() -> None:
            opened.append(await cache.open(slow_id))

        tasks.start_soon(open_slow)
        tasks.start_soon(open_slow)
        await slow.reading.wait()
        slow.release.set()
    assert slow.reads == [slow_id] and len(opened) == 2 and opened[0] is opened[1]
    assert not len(cache._opening)  # nothing kept once nobody opens
