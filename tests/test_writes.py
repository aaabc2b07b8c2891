"""A session's background writes (``server/sessions/writes.py``): held while a turn's first chunk is
on its way, started on release or when the hold runs out, refusals raised by ``check``."""

from __future__ import annotations

import time

import anyio
import pytest

from server.errors import StoreUnavailable
from server.sessions import writes as writes_module
from server.sessions.writes import HOLD_SECONDS, Writes

pytestmark = pytest.mark.anyio


def recorder(done: list[str], name: str, ran: anyio.Event | None = None):
    async def write() -> None:
        done.append(name)
        if ran is not None:
            ran.set()
    return write


async def test_writes_held_wait_for_release_then_run_in_order(monkeypatch):
    monkeypatch.setattr(writes_module, "HOLD_SECONDS", 60.0)  # only the release may start them here
    done: list[str] = []
    async with anyio.create_task_group() as tasks:
        writes = Writes("s1", tasks)
        writes.hold()
        writes.start(recorder(done, "message"))
        writes.start(recorder(done, "trim"))
        await anyio.wait_all_tasks_blocked()
        assert done == []  # nothing ran while held
        writes.release()
        await writes.check()
        assert done == ["message", "trim"]
        writes.start(recorder(done, "after"))  # released: a write starts at once
        await writes.check()
    assert done == ["message", "trim", "after"]


async def test_writes_held_start_by_themselves_when_the_hold_runs_out():
    done: list[str] = []
    ran = anyio.Event()
    async with anyio.create_task_group() as tasks:
        writes = Writes("s1", tasks)
        began = time.monotonic()
        writes.hold()
        writes.start(recorder(done, "message", ran))
        with anyio.fail_after(5):
            await ran.wait()  # no release: the timer starts them
        waited = time.monotonic() - began
        await writes.check()
    assert done == ["message"] and waited >= HOLD_SECONDS * 0.9


async def test_check_starts_held_writes_and_raises_a_refusal_once():
    async def refused() -> None:
        raise StoreUnavailable("the session store refused the write")

    done: list[str] = []
    async with anyio.create_task_group() as tasks:
        writes = Writes("s1", tasks)
        writes.hold()
        writes.start(refused)
        writes.start(recorder(done, "next"))
        with pytest.raises(StoreUnavailable), anyio.fail_after(5):
            await writes.check()  # the turn ends: held writes start now, not after the hold
        await writes.check()  # raised once: the next turn starts clean
    assert done == ["next"]  # a refusal does not stop the writes after it
