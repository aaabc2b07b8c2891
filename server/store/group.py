"""``CallQueue``: the store's calls that come while a batch is on its way leave together, in one hop.

Each call to the SQLite store was its own hop to a worker thread. When 500 sessions opened within two
seconds, anyio started worker threads until the process ran 36, all waiting on the store's one lock
and on the GIL (each SQLite statement gives the GIL up and takes it back), and a session's creation
reached the event loop about 100 ms after its thread finished (docs/performance.md, stop 29). Now
one batch is on its way at a time (for each event loop: the store keeps a queue per loop): it takes
every call queued while the previous one was on its way and runs them in one call of the worker
thread, in the order they came, under the store's lock. Each runs as it would alone (its own
transaction, or none for a read), and its caller alone gets what it returned or raised.

Writes queued with ``write`` (a reply's final write) that follow each other in a batch go as one
transaction (``transaction``), a savepoint each: when 500 replies end together, most of a final write
is its full-text segment, and a group commits one. A write that raises is undone alone and its
caller alone gets the error, as long as the transaction stands; an error that ended the transaction
(SQLite rolls back on some, such as a full disk) fails the whole group, and every caller in it gets
its own copy of that error (each may write again).

``errors`` turns what SQLite raised into what the store raises. A caller already cancelled queues
nothing; once its call is queued, it waits for it whatever anyio cancels, as it waited for its thread
before. anyio's shield does not hold against asyncio's own ``Task.cancel`` (the loop closing):
if the leader of a batch gets one, every call of the batch not yet ended gets a copy of that
cancellation, though the worker thread may still finish them.
"""

from __future__ import annotations

import copy
import sqlite3
import threading
from collections.abc import Callable
from itertools import groupby
from operator import attrgetter
from typing import Any, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

T = TypeVar("T")
_PENDING: Any = object()


class _Queued:
    __slots__ = ("fn", "grouped", "result", "error")

    def __init__(self, fn: Callable[[], Any], grouped: bool) -> None:
        self.fn = fn
        self.grouped = grouped
        self.result: Any = _PENDING
        self.error: BaseException | None = None

    @property
    def ended(self) -> bool:
        return self.result is not _PENDING or self.error is not None


class CallQueue:
    """Calls to one SQLite connection, run in batches on a worker thread under ``lock``."""

    def __init__(self, connection: sqlite3.Connection, lock: threading.Lock,
                 transaction: Callable[[Callable[[], None]], None],
                 errors: Callable[[Exception], Exception]) -> None:
        self._connection = connection
        self._lock = lock
        self._transaction = transaction
        self._errors = errors
        self._queued: list[_Queued] = []
        self._flight: anyio.Event | None = None  # set when the batch on its way has ended
        self.batches = 0  # hops to the worker thread (tests and benches read it)

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the worker thread, as it would run alone."""
        queued = await self._wait(_Queued(fn, grouped=False))
        if queued.error is not None:
            raise queued.error
        return cast(T, queued.result)

    async def write(self, write: Callable[[], object]) -> None:
        """``write()`` in one transaction with the writes queued next to it, in its own savepoint."""
        queued = await self._wait(_Queued(write, grouped=True))
        if queued.error is not None:
            raise queued.error

    async def _wait(self, queued: _Queued) -> _Queued:
        await anyio.lowlevel.checkpoint_if_cancelled()
        self._queued.append(queued)
        with anyio.CancelScope(shield=True):
            while not queued.ended:
                if self._flight is None:
                    await self._lead()
                else:
                    await self._flight.wait()
        return queued

    async def _lead(self) -> None:
        batch, self._queued = self._queued, []
        self._flight = flight = anyio.Event()
        try:
            await anyio.to_thread.run_sync(self._run, batch)
            self.batches += 1
        except BaseException as exc:  # not one call's error (each is kept on its own): the batch's
            for queued in batch:
                if not queued.ended:
                    queued.error = _own_copy(exc)
        finally:
            self._flight = None
            flight.set()

    def _run(self, batch: list[_Queued]) -> None:
        """On the worker thread: the batch in order, each grouped run of writes in one transaction."""
        with self._lock:
            for grouped, run in groupby(batch, key=attrgetter("grouped")):
                if grouped:
                    self._group(list(run))
                else:
                    for queued in run:
                        self._alone(queued)

    def _alone(self, queued: _Queued) -> None:
        try:
            queued.result = queued.fn()
        except Exception as exc:
            queued.error = self._errors(exc)

    def _group(self, group: list[_Queued]) -> None:
        try:
            self._transaction(lambda: self._each(group))
        except Exception as exc:  # the transaction ended as a whole: every write in it failed
            error = self._errors(exc)
            for queued in group:
                if queued.error is None:
                    queued.error = _own_copy(error)
        else:
            for queued in group:
                if queued.error is None:
                    queued.result = None

    def _each(self, group: list[_Queued]) -> None:
        """In the transaction: each write in its savepoint."""
        connection = self._connection
        for queued in group:
            connection.execute("SAVEPOINT grouped")
            try:
                queued.fn()
            except Exception as exc:
                if not connection.in_transaction:
                    raise  # SQLite ended the transaction: the group fails
                connection.execute("ROLLBACK TO grouped")
                queued.error = self._errors(exc)
            connection.execute("RELEASE grouped")


def _own_copy(error: BaseException) -> BaseException:
    """A copy of a batch's error for one caller (raised in many tasks, one object would collect all
    their tracebacks), caused by the original."""
    try:
        mine = copy.copy(error)
    except Exception:  # an error that cannot be copied: the original, shared
        return error
    mine.__cause__, mine.__traceback__ = error, None
    return mine
