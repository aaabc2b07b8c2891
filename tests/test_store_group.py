"""Replies that end together are written as one transaction (``server/store/group.py``), on a real
SQLite file: every write lands or fails for its own caller, as with one transaction each."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from server.errors import StoreUnavailable, UnknownSession
from server.history.messages import ChatMessage
from server.store.sqlite import SqliteStore

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
