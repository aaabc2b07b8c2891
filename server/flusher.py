"""``Flusher``: the streaming replies of every session saved together, one transaction per tick.

Each turn's ``ReplyWriter`` still decides when its reply is due in the store (every
``store_flush_ms``); the turn hands the message to the flusher (``due``, no await on the chunk path)
instead of writing it itself. One task writes whatever is due in one ``Store.save_batch`` call; what
falls due while that write runs forms the next batch, so a busy server makes fewer, larger
transactions and an idle one writes at once. The task exists only while something is pending.

``settle(session_id)`` is called before a reply's final save: it forgets the session's pending
flush and waits for a batch in flight, so a flush taken before the reply ended can never land after
its final save. A failed batch is logged; the reply's final save still follows.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskGroup

from server.history import ChatMessage
from server.store import Store

log = logging.getLogger(__name__)


class Flusher:
    def __init__(self, store: Store, tasks: TaskGroup) -> None:
        self._store = store
        self._tasks = tasks
        self._pending: dict[str, dict[str, ChatMessage]] = {}  # session id -> message id -> message
        self._writing = anyio.Lock()
        self._running = False
        self.batches = 0  # transactions written (benches and tests read it)

    def due(self, session_id: str, message: ChatMessage) -> None:
        self._pending.setdefault(session_id, {})[message.id] = message
        if not self._running:
            self._running = True
            self._tasks.start_soon(self._drain)

    async def settle(self, session_id: str) -> None:
        self._pending.pop(session_id, None)
        async with self._writing:  # a batch in flight finishes before the final save starts
            pass

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, {}
                async with self._writing:
                    await self._write(batch)
        finally:
            self._running = False

    async def _write(self, batch: dict[str, dict[str, ChatMessage]]) -> None:
        try:
            await self._store.save_batch({sid: list(messages.values()) for sid, messages in batch.items()})
            self.batches += 1
        except Exception:  # the replies' final saves still follow; a flush is only a checkpoint
            log.exception("saving %d streaming replies failed", len(batch))
