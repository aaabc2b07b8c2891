"""The store's calls that come together take one hop, and replies that end together are written as one
transaction (``server/store/group.py``), on a real SQLite file: each call returns or fails for its
own caller, in the order the calls came, as when each had its own hop; a group of writes fails as a
whole only when its transaction does."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import anyio
import pytest

from server.errors import SessionExists, StoreUnavailable, UnknownSession
from server.history.messages import ChatMessage
from server.store.sqlite import SqliteStore, _row

pytestmark = pytest.mark.anyio


def reply(n: int) -> list[ChatMessage]:
    return [ChatMessage("user", f"question {n}"), ChatMessage("assistant", f"answer {n} " * 50)]


async def opened(tmp_path: Path, sessions: int) -> tuple[SqliteStore, list[str]]:
    store = SqliteStore.open(tmp_path)
    ids = [f"s{n}" for n in range(sessions)]
    for session_id in ids:
        await store.create_session(session_id, title="t", route="demo/m")
    return store, ids


async def save_all(store: SqliteStore, ids: list[str]) -> dict[str, BaseException | None]:
    outcome: dict[str, BaseException | None] = {}

    async def save(n: int, session_id: str) -> None:
        try:
            await store.save_messages(session_id, reply(n))
            outcome[session_id] = None
        except Exception as exc:
            outcome[session_id] = exc
    async with anyio.create_task_group() as group:
        for n, session_id in enumerate(ids):
            group.start_soon(save, n, session_id)
    return outcome


async def test_replies_ending_together_are_written_in_a_few_transactions(tmp_path: Path) -> None:
    store, ids = await opened(tmp_path, 50)
    begun: list[str] = []
    store._conn.set_trace_callback(lambda sql: begun.append(sql) if sql.startswith("BEGIN") else None)
    assert set((await save_all(store, ids)).values()) == {None}
    store._conn.set_trace_callback(None)
    assert 1 <= len(begun) <= 3, begun  # the first alone, the rest as they queued behind it
    for n, session_id in enumerate(ids):
        stored = await store.get_session(session_id)
        assert stored is not None and [m.content for m in stored.messages] == [m.content for m in reply(n)]
    await store.close()


async def test_a_session_deleted_meanwhile_fails_alone(tmp_path: Path) -> None:
    store, ids = await opened(tmp_path, 20)
    await store.delete_session("s7")
    outcome = await save_all(store, ids)
    assert isinstance(outcome.pop("s7"), UnknownSession)
    assert set(outcome.values()) == {None}
    for session_id in outcome:
        stored = await store.get_session(session_id)
        assert stored is not None and len(stored.messages) == 2
    await store.close()


async def test_a_store_that_refuses_fails_every_write_of_the_group_and_they_can_be_written_again(
        tmp_path: Path) -> None:
    store, ids = await opened(tmp_path, 20)
    store._conn.execute("PRAGMA query_only = ON")  # SQLite refuses every write, as a read-only disk does
    outcome = await save_all(store, ids)
    assert all(isinstance(error, StoreUnavailable) for error in outcome.values()), outcome
    for session_id in ids:
        stored = await store.get_session(session_id)
        assert stored is not None and stored.messages == []
    store._conn.execute("PRAGMA query_only = OFF")
    assert set((await save_all(store, ids)).values()) == {None}
    await store.close()


async def test_a_cancelled_caller_still_waits_for_its_write(tmp_path: Path) -> None:
    store, ids = await opened(tmp_path, 10)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            for n, session_id in enumerate(ids):
                group.start_soon(store.save_messages, session_id, reply(n))
            await anyio.lowlevel.checkpoint()
            scope.cancel()
    for session_id in ids:  # each write was queued at the call: it lands, and the cancel takes after it
        stored = await store.get_session(session_id)
        assert stored is not None and len(stored.messages) == 2
    await store.close()


async def test_a_write_that_raises_fails_alone_and_the_rest_of_its_group_lands(tmp_path: Path) -> None:
    store, ids = await opened(tmp_path, 10)
    before = await store.get_session("s1")
    outcome: dict[str, BaseException | None] = {}

    def failing() -> None:
        store._put_final("s1", [])  # the session touched, then a bug: the savepoint undoes the touch
        raise ValueError("a bug in one write")

    async def write(session_id: str, run: Callable[[], object]) -> None:
        try:
            await store.calls.write(run)
            outcome[session_id] = None
        except Exception as exc:
            outcome[session_id] = exc
    async with anyio.create_task_group() as group:
        for n, session_id in enumerate(ids):  # the first leads alone; the rest queue behind it
            group.start_soon(write, session_id, failing if n == 1 else partial(
                store._put_final, session_id, [_row(message) for message in reply(n)]))
    assert isinstance(outcome.pop("s1"), ValueError) and set(outcome.values()) == {None}
    stored = await store.get_session("s1")
    assert stored is not None and before is not None
    assert stored.messages == [] and stored.updated_at == before.updated_at
    await store.close()


async def test_a_caller_cancelled_before_it_writes_writes_nothing(tmp_path: Path) -> None:
    # A shutdown's drain gives up on the writes left after its grace by cancelling them.
    store, _ = await opened(tmp_path, 1)
    with anyio.CancelScope() as scope:
        scope.cancel()
        await store.save_messages("s0", reply(0))
    stored = await store.get_session("s0")
    assert stored is not None and stored.messages == []
    await store.close()


async def test_calls_that_come_together_take_one_thread_and_a_few_hops(tmp_path: Path) -> None:
    store = SqliteStore.open(tmp_path)
    threads: set[int] = set()

    async def create(n: int) -> None:
        await store._call(lambda: threads.add(threading.get_ident()))
        await store.create_session(f"s{n}", title=f"title {n}", route="demo/m")
    hops = store.calls.batches
    async with anyio.create_task_group() as group:
        for n in range(50):
            group.start_soon(create, n)
    assert len(threads) == 1  # one hop at a time: not a thread each, all waiting on the store's lock
    assert store.calls.batches - hops <= 6  # each of the two steps: the first alone, the rest behind it
    titles: dict[int, str] = {}

    async def read(n: int) -> None:  # each caller gets what its own call returned
        stored = await store.get_session(f"s{n}")
        assert stored is not None
        titles[n] = stored.title
    async with anyio.create_task_group() as group:
        for n in range(50):
            group.start_soon(read, n)
    assert titles == {n: f"title {n}" for n in range(50)}
    await store.close()


async def test_a_call_that_fails_fails_alone_in_its_batch(tmp_path: Path) -> None:
    store, _ = await opened(tmp_path, 1)
    outcome: dict[int, BaseException | None] = {}

    async def create(n: int) -> None:
        try:
            await store.create_session(f"s{n}", title="t", route="demo/m")  # s0 exists already
            outcome[n] = None
        except Exception as exc:
            outcome[n] = exc
    async with anyio.create_task_group() as group:
        for n in (1, 2, 0, 3, 4):
            group.start_soon(create, n)
    assert isinstance(outcome.pop(0), SessionExists) and set(outcome.values()) == {None}
    assert {s.id for s in await store.list_sessions()} == {"s0", "s1", "s2", "s3", "s4"}
    await store.close()


async def test_a_batch_runs_its_calls_in_the_order_they_came(tmp_path: Path) -> None:
    store, _ = await opened(tmp_path, 2)
    outcome: dict[str, BaseException | None] = {}

    async def step(name: str, call: Callable[[], object]) -> None:
        try:
            await call()  # type: ignore[misc]
            outcome[name] = None
        except Exception as exc:
            outcome[name] = exc
    async with anyio.create_task_group() as group:  # the first leads; the rest form one batch
        group.start_soon(step, "lead", partial(store.get_session, "s0"))
        group.start_soon(step, "save s0", partial(store.save_messages, "s0", reply(0)))
        group.start_soon(step, "delete s0", partial(store.delete_session, "s0"))
        group.start_soon(step, "delete s1", partial(store.delete_session, "s1"))
        group.start_soon(step, "save s1", partial(store.save_messages, "s1", reply(1)))
    assert isinstance(outcome.pop("save s1"), UnknownSession)  # deleted before: as with a hop each
    assert set(outcome.values()) == {None}
    assert await store.get_session("s0") is None and await store.get_session("s1") is None
    await store.close()
