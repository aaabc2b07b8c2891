"""The services a running server shares: settings, store, providers, resolver, bus, calibration.

Built once in the app's lifespan; turns and sockets receive it instead of reaching for globals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anyio.abc import TaskGroup

from server.config import Settings
from server.events import EventBus
from server.providers.base import Provider
from server.routing import RouteResolver
from server.store import Store

if TYPE_CHECKING:
    from server.session import Turn


class NoCompaction:
    async def compact(self, turn: Turn) -> None:
        return None


@dataclass
class Runtime:
    settings: Settings
    store: Store
    providers: dict[str, Provider]
    resolver: RouteResolver
    bus: EventBus
    task_group: TaskGroup
    compactor: Any = None

    def __post_init__(self) -> None:
        if self.compactor is None:
            self.compactor = NoCompaction()
