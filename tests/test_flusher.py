"""``Flusher`` over the real SQLite store: the replies of several sessions in one transaction, and
no flush taken before a reply ended ever lands after its final save."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import pytest

from server.history.messages import ChatMessage
from server.sessions.flusher import Flusher
from server.store.sqlite import SqliteStore
from tests.support import iterations_until

pytestmark = pytest.mark.anyio


class GatedStore(SqliteStore):
    """The real store; a batch waits at the gate, so a test can act while it is in flight."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.entered = anyio.Event()
        self.gate = anyio.Event()
        self.saved = anyio.Event()

    async def save_batch(self, batch: Mapping[str, Sequence[ChatMessage]]) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().save_batch(batch)
        self.saved.set()


def reply(text: str) -> ChatMessage:
    return ChatMessage("assistant", text, turn_id="t", interrupted=True, id="r1")


async def contents(store: SqliteStore, session_id: str) -> list[str]:
    stored = await store.get_session(session_id)
    assert stored is not None
    return [m.content for m in stored.messages]


async def test_flusher_saves_what_fell_due_together_in_one_transaction(tmp_path):
    store = GatedStore.open(tmp_path)
    for sid in ("a", "b", "c"):
        await store.create_session(sid, title=sid, route="demo/demo-small")
    await store.delete_session("b")  # deleted mid-stream: skipped, the others still saved
    async with anyio.create_task_group() as tasks:
        flusher = Flusher(store, tasks)
        for sid in ("a", "b", "c"):
            flusher.due(sid, reply(f"text of {sid}"))
        await store.entered.wait()
        store.gate.set()
        await flusher.settle("nobody")  # waits for the batch in flight
    assert flusher.batches == 1
    assert await contents(store, "a") == ["text of a"] and await contents(store, "c") == ["text of c"]
    await store.close()


async def test_a_flush_in_flight_never_lands_after_the_final_save(tmp_path):
    store = GatedStore.open(tmp_path)
    await store.create_session("s", title="s", route="demo/demo-small")
    finished = anyio.Event()

    async def finish(flusher: Flusher) -> None:  # what Turn.finish_reply does
        await flusher.settle("s")
        final = reply("partial and the rest")
        final.interrupted = False
        await store.save_messages("s", [final])
        finished.set()

    async with anyio.create_task_group() as tasks:
        flusher = Flusher(store, tasks)
        flusher.due("s", reply("partial"))
        await store.entered.wait()  # the stale flush is in flight
        tasks.start_soon(finish, flusher)
        store.gate.set()
        await finished.wait()
    stored = await store.get_session("s")
    assert stored is not None and [(m.content, m.interrupted) for m in stored.messages] == [
        ("partial and the rest", False)]
    await store.close()


async def test_settle_forgets_a_flush_not_yet_written(tmp_path):
    store = GatedStore.open(tmp_path)
    await store.create_session("s", title="s", route="demo/demo-small")
    store.gate.set()
    async with anyio.create_task_group() as tasks:
        flusher = Flusher(store, tasks)
        flusher.due("s", reply("stale"))
        await flusher.settle("s")  # before the flusher's task ran: nothing of it is written
    assert await contents(store, "s") == [] and flusher.batches == 0
    await store.close()


async def test_checkpoints_leave_the_search_index_and_the_final_save_indexes(tmp_path):
    # Re-indexing the whole reply at every checkpoint was the largest cost of a paced stream
    # (migration 6); the final save, complete or interrupted, makes the whole text searchable.
    store = SqliteStore.open(tmp_path)
    for sid in ("done", "stopped"):
        await store.create_session(sid, title=sid, route="demo")
        await store.save_batch({sid: [reply("first words")]})
        await store.save_batch({sid: [reply("first words, then lighthouse")]})
    assert await store.list_sessions("lighthouse") == []  # the checkpoint did not re-index
    assert await contents(store, "done") == ["first words, then lighthouse"]
    complete = reply("first words, then lighthouse keeper")
    complete.interrupted = False
    await store.save_messages("done", [complete])
    await store.save_messages("stopped", [reply("first words, then lighthouse beam")])
    assert [s.id for s in await store.list_sessions("keeper")] == ["done"]
    assert [s.id for s in await store.list_sessions("beam")] == ["stopped"]
    assert await store.list_sessions("then") != []
    await store.close()


async def test_a_checkpoint_after_the_first_rewrites_the_row_alone(tmp_path):
    # The first checkpoint inserts the reply's row (the session touched, a position found); the
    # later ones rewrite that row in place and touch nothing else: the session's time and every
    # other row stay as they were, until the final save touches the session.
    store = SqliteStore.open(tmp_path)
    await store.create_session("s", title="s", route="demo")
    await store.save_messages("s", [ChatMessage("user", "a question")])
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    await store.save_batch({"s": [reply("first words")]})
    first = await store.get_session("s")
    statements.clear()
    await store.save_batch({"s": [reply("first words, then more")]})
    assert not [sql for sql in statements if "sessions" in sql or sql.startswith(("INSERT", "SELECT"))]
    store._conn.set_trace_callback(None)
    later = await store.get_session("s")
    assert first is not None and later is not None and later.updated_at == first.updated_at
    assert [m.content for m in later.messages] == ["a question", "first words, then more"]
    await store.delete_session("s")  # deleted while it streams: the checkpoint writes nothing
    await store.save_batch({"s": [reply("first words, then more, and more")]})
    assert await store.get_session("s") is None
    await store.close()


async def test_replies_ending_together_all_go_on_when_the_batch_in_flight_is_written(tmp_path):
    # 100 replies end while one batch is written: each settle waits for that batch, and all of them
    # go on in the same few loop iterations, not one per iteration as a lock handed over would.
    store = GatedStore.open(tmp_path)
    await store.create_session("s", title="s", route="demo/demo-small")
    settled: list[str] = []

    async def end(flusher: Flusher, session_id: str) -> None:
        await flusher.settle(session_id)
        settled.append(session_id)

    async with anyio.create_task_group() as tasks:
        flusher = Flusher(store, tasks)
        flusher.due("s", reply("partial"))
        await store.entered.wait()
        for n in range(100):
            tasks.start_soon(end, flusher, f"r{n}")
        await anyio.wait_all_tasks_blocked()
        assert not settled
        store.gate.set()
        await store.saved.wait()
        loop = asyncio.get_running_loop()
        iterations = await iterations_until(loop, lambda: len(settled) == 100, most=1000)
    assert len(settled) == 100 and iterations <= 5, iterations
    await store.close()
