"""The observer bus: dashboards and event subscribers see what sessions do, apart from any socket.

``EventBus.publish`` never blocks a turn: each subscriber has a bounded queue, and a subscriber
that falls behind loses its oldest events (counted in ``dropped``) rather than slowing the server.
``/events`` serves the bus as Server-Sent Events (``event: <type>``, ``data: <json>``); a signed-in
user's stream carries only their own sessions' events (``allowed``). ``close``
(at shutdown) ends every stream once it has sent what it holds, so no subscriber holds the server
open.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio

OBSERVED_TYPES = ("history_trimmed", "done", "error", "route", "session")


class Subscription:
    def __init__(self, limit: int) -> None:
        self._events: deque[dict[str, Any]] = deque(maxlen=limit)
        self._ready = anyio.Event()
        self.dropped = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self._ready.set()

    def cut(self) -> None:
        """End now, dropping what is pending (the subscriber may no longer see it)."""
        self._events.clear()
        self.close()

    @property
    def pending(self) -> int:
        return len(self._events)

    def push(self, event: dict[str, Any]) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        self._events.append(event)
        self._ready.set()

    async def next(self) -> dict[str, Any] | None:
        """The next event; None once the subscription is closed and empty."""
        while not self._events:
            if self.closed:
                return None
            await self._ready.wait()
            self._ready = anyio.Event()
        return self._events.popleft()


class EventBus:
    def __init__(self, limit: int = 1000) -> None:
        self._subscribers: set[Subscription] = set()
        self._limit = limit
        self.closed = False

    def publish(self, session_id: str, frame: dict[str, Any]) -> None:
        if frame.get("type") not in OBSERVED_TYPES or not self._subscribers:
            return
        event = {**frame, "session_id": session_id, "source": "observability", "timestamp": time.time()}
        for subscription in self._subscribers:
            subscription.push(event)

    def subscribe(self) -> Subscription:
        subscription = Subscription(self._limit)
        if self.closed:
            subscription.close()
        self._subscribers.add(subscription)
        return subscription

    def close(self) -> None:
        """The server is going away: every stream ends (a new one ends at once)."""
        self.closed = True
        for subscription in self._subscribers:
            subscription.close()

    def unsubscribe(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)


Allowed = Callable[[str], Awaitable[bool]]  # may this subscriber see the events of this session id?


async def sse_stream(bus: EventBus, keepalive_seconds: float = 15.0, allowed: Allowed | None = None,
                     subscription: Subscription | None = None) -> AsyncIterator[str]:
    """The bus as Server-Sent Events; with ``allowed``, only the events of sessions it admits. A
    ``subscription`` made by the caller (``bus.subscribe()``) lets it end the stream (``cut``)."""
    subscription = subscription or bus.subscribe()
    try:
        yield ": meterchat events\n\n"
        while not subscription.closed or subscription.pending:
            event: dict[str, Any] | None = None
            with anyio.move_on_after(keepalive_seconds):
                event = await subscription.next()
            if event is None:
                if not subscription.closed:
                    yield ": keepalive\n\n"
                continue
            if allowed is not None and not await allowed(event["session_id"]):
                continue
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
    finally:
        bus.unsubscribe(subscription)
