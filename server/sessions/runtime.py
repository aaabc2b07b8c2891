"""The services a running server shares: settings, store, providers, resolver, bus, task group,
metrics, and the meter and the flusher (streaming replies saved in batches) built from them.

Built once in the app's lifespan; the hub and the turns receive it instead of reaching for globals.
``options`` is the ``[runtime]`` settings table, read by every turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anyio.abc import TaskGroup

from server.config.settings import RuntimeSettings, Settings
from server.providers.base import Provider
from server.routing.meter import Meter
from server.routing.resolver import RouteResolver
from server.sessions.events import EventBus
from server.sessions.flusher import Flusher
from server.sessions.metrics import Metrics
from server.store.base import Store
from server.tools.toolbox import Toolbox


@dataclass
class Runtime:
    settings: Settings
    store: Store
    providers: dict[str, Provider]
    resolver: RouteResolver
    bus: EventBus
    task_group: TaskGroup
    metrics: Metrics = field(default_factory=Metrics)
    toolbox: Toolbox = field(default_factory=lambda: Toolbox({}, 0))
    meter: Meter = field(init=False)
    flusher: Flusher = field(init=False)

    def __post_init__(self) -> None:
        self.meter = Meter(self.resolver, self.settings.providers, self.options.reply_reserve_tokens,
                           self.toolbox, self.options.image_token_cost)
        self.resolver.remember_windows(self.store)
        self.flusher = Flusher(self.store, self.task_group)

    @property
    def options(self) -> RuntimeSettings:
        return self.settings.runtime
