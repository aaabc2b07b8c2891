from __future__ import annotations

import logging

import anyio
import pytest

from server.routing.resolver import RouteResolver
from server.sessions.events import EventBus
from server.sessions.hub import SessionHub
from server.sessions.runtime import Runtime
from server.store.backends import open_store
from tests.support import settings_for

pytestmark = pytest.mark.anyio


async def test_hub_spawned_failure_is_logged_and_the_server_goes_on(tmp_path, caplog):
    settings = settings_for(tmp_path)
    store = open_store(tmp_path / "data")
    ran = anyio.Event()

    async def broken() -> None:
        raise RuntimeError("boom")

    async def fine() -> None:
        ran.set()

    try:
        async with anyio.create_task_group() as tasks:
            hub = SessionHub(Runtime(settings, store, {}, RouteResolver(settings, {}), EventBus(), tasks))
            with caplog.at_level(logging.ERROR, logger="server.sessions.hub"):
                hub.spawn(broken)
                hub.spawn(fine)  # started after broken (tasks start in order): it ran and failed first
                await ran.wait()
    finally:
        await store.close()
    assert "background task broken failed" in caplog.text
