"""The one route resolver: which provider/model serves a call, its capacity, budget and cost.

Provider dispatch, budget resolution, the context meter and cost accounting all ask this module,
so a classifier hint or an explicit switch moves every one of them to the same provider/model pair.

Route strings are ``"alias"`` (the profile's configured ``model``) or ``"alias/model"``, split on the
first ``/`` only, so ``openrouter/meta-llama/llama-3-8b`` is alias ``openrouter`` and model
``meta-llama/llama-3-8b``. ``parse`` validates before anything changes and raises ``UnknownRoute``
naming what was asked and what exists when:
- the alias is not configured;
- an alias-only route names a profile without a ``model``;
- the model is not known from config (the profile's ``model`` or a key of its ``models``) and the
  list is authoritative: always for ``demo`` (it can only serve its own models), and for other kinds
  when ``models`` is listed *and* ``discover_window`` is off. Otherwise any model name is accepted,
  since a local or remote server may well have it.

Capacity (the model's context window) is known from config only for the pair it was configured
for: the profile's ``context_window`` for its ``model``, or ``models[model]``. A different model
never borrows the profile's window. Otherwise, with ``discover_window``, the provider's metadata is
asked once per (alias, model) and a known answer cached; an unknown answer is cached for
``UNKNOWN_RETRY_SECONDS``, so an unreachable server is not asked on every turn but is asked again
once it may have come up. A window a provider named in its own overflow error (``learn_window``)
outranks both: the provider enforced it. It is kept through ``WindowMemory`` (the store) and read
back once. ``capacity`` never raises.

Every map keyed by a route a client may name (discovered windows, their locks, calibrations) holds
at most ``server.route_cache_entries`` routes, least recently used out first: a client naming a
million model names costs a bounded amount of memory.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from server.config.settings import ProviderProfile, Settings
from server.errors import ConfigError, UnknownRoute
from server.history.budget import effective_context_budget
from server.history.messages import ServedBy
from server.locks import KeyedLock
from server.providers.base import Provider
from server.routing.calibration import Calibrations
from server.routing.classifier import Classifier

log = logging.getLogger(__name__)

ROUTE_KINDS = ("default", "hint", "switch", "fallback")
UNKNOWN_RETRY_SECONDS = 60.0
_HINT_PREFIX = re.compile(r"/hint[ \t]+(\S+)(?:[ \t]*\r?\n|[ \t]+|$)")


@dataclass(frozen=True)
class Route:
    provider: str  # the provider alias
    model: str
    kind: str = "switch"
    hint: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ROUTE_KINDS:
            raise ValueError(f"route kind must be one of {', '.join(ROUTE_KINDS)}, got {self.kind!r}")
        if not self.provider or not self.model:
            raise ValueError(f"route needs a provider and a model, got {self.provider!r}/{self.model!r}")

    @property
    def name(self) -> str:
        return f"{self.provider}/{self.model}"

    def fields(self) -> dict[str, Any]:
        """``{provider, model, route_kind, hint?}``: the body of a ``route`` frame."""
        return self.served_by().fields()

    def served_by(self) -> ServedBy:
        """This route as the reply its call writes keeps it."""
        return ServedBy(self.provider, self.model, self.kind, self.hint)


class WindowMemory(Protocol):
    """Where windows learned from overflow errors outlive the process (the store implements it)."""

    async def load_windows(self) -> dict[tuple[str, str], int]: ...
    async def save_window(self, provider: str, model: str, tokens: int) -> None: ...


@dataclass(frozen=True)
class Capacity:
    window: int | None
    source: str | None = None  # config | provider | provider_error; None when unknown

    @property
    def known(self) -> bool:
        return self.window is not None


UNKNOWN_CAPACITY = Capacity(None, None)


def _known_models(profile: ProviderProfile) -> list[str]:
    names = [profile.model] if profile.model else []
    return names + [name for name in profile.models if name and name not in names]


def _models_are_authoritative(profile: ProviderProfile) -> bool:
    if profile.kind == "demo":
        return True
    return bool(profile.models) and not profile.discover_window


def _config_capacity(profile: ProviderProfile, model: str) -> Capacity | None:
    if profile.context_window > 0 and model == profile.model:
        return Capacity(profile.context_window, "config")
    window = profile.models.get(model, 0)
    if window > 0:
        return Capacity(window, "config")
    return None


class RouteResolver:
    """Resolves route strings and hints, and answers capacity, budget and cost per route."""

    def __init__(self, settings: Settings, providers: Mapping[str, Provider]) -> None:
        self.settings = settings
        self.providers = providers
        self.classifier = Classifier(settings.classifier_rules)
        self.cache_entries = max(1, settings.server.route_cache_entries)
        self.calibration = Calibrations(limit=self.cache_entries)
        self._hints = self._resolve_hints()
        self._windows: OrderedDict[tuple[str, str], tuple[Capacity, float]] = OrderedDict()  # answer, retry
        self._discovering = KeyedLock()  # a route's window asked of its provider once at a time
        self._learned: dict[tuple[str, str], int] = {}  # windows named by overflow errors
        self._memory: WindowMemory | None = None
        self._recalled = False

    # -- route strings ---------------------------------------------------------------------

    def routes(self) -> list[str]:
        """What the model picker offers: the default route first, then every configured pair."""
        names = [self.default_route().name]
        for alias, profile in self.settings.providers.items():
            names += [f"{alias}/{model}" for model in _known_models(profile)]
        return list(dict.fromkeys(names))

    def parse(self, route: str, kind: str = "switch") -> Route:
        alias, _, model = route.strip().partition("/")
        profile = self.settings.providers.get(alias)
        if profile is None:
            raise UnknownRoute(f"unknown provider {alias!r} in route {route!r} "
                               f"(configured: {', '.join(self.settings.providers) or 'none'})")
        if not model:
            if not profile.model:
                raise UnknownRoute(f"provider {alias!r} has no configured model; "
                                   f"name one as {alias}/MODEL")
            return Route(alias, profile.model, kind)
        known = _known_models(profile)
        if model not in known and _models_are_authoritative(profile):
            raise UnknownRoute(f"unknown model {model!r} for provider {alias!r} "
                               f"(available: {', '.join(f'{alias}/{m}' for m in known) or 'none'})")
        return Route(alias, model, kind)

    def default_route(self) -> Route:
        return self.parse(self.settings.default_route, kind="default")

    # -- hints -----------------------------------------------------------------------------

    def _resolve_hints(self) -> dict[str, Route]:
        hints: dict[str, Route] = {}
        for index, entry in enumerate(self.settings.model_routes):
            target = f"{entry.provider}/{entry.model}" if entry.model else entry.provider
            try:
                route = self.parse(target, kind="hint")
            except UnknownRoute as exc:
                raise ConfigError(f"model_routes[{index}]: {exc.message}") from exc
            hints.setdefault(entry.hint, replace(route, hint=entry.hint))  # first entry wins
        return hints

    def hints(self) -> dict[str, Route]:
        """Each configured hint and the route it names."""
        return dict(self._hints)

    def route_for_hint(self, session_route: Route, hint: str) -> Route:
        """The hint's route, or the session's pair marked ``fallback`` when no route has that hint."""
        route = self._hints.get(hint)
        if route is not None:
            return route
        return replace(session_route, kind="fallback", hint=hint)

    def for_message(self, session_route: Route, text: str) -> tuple[Route, str]:
        """Route for one call and the text to send; a ``/hint NAME`` prefix is stripped."""
        match = _HINT_PREFIX.match(text)
        if match is not None:
            return self.route_for_hint(session_route, match.group(1)), text[match.end():]
        hint = self.classifier.hint_for(text)
        if hint is None:
            return session_route, text
        return self.route_for_hint(session_route, hint), text

    # -- capacity, budget, cost --------------------------------------------------------------

    def remember_windows(self, memory: WindowMemory) -> None:
        self._memory = memory

    @property
    def window_memory(self) -> WindowMemory | None:
        return self._memory

    def adopt_window(self, provider: str, model: str, tokens: int) -> None:
        """Another instance learned this window (and stored it): use it from now on."""
        if tokens > 0:
            self._learned[(provider, model)] = tokens

    async def learn_window(self, route: Route, tokens: int) -> bool:
        """A provider refused for context length and named its limit: that is the route's window
        from now on (persisted). False when it was already known to be that."""
        key = (route.provider, route.model)
        await self._recall()
        if tokens <= 0 or self._learned.get(key) == tokens:
            return False
        self._learned[key] = tokens
        if self._memory is not None:
            await self._memory.save_window(route.provider, route.model, tokens)
        return True

    async def _recall(self) -> None:
        if self._recalled or self._memory is None:
            return
        self._recalled = True  # first, so two turns do not both read
        try:
            self._learned = {**await self._memory.load_windows(), **self._learned}
        except Exception as exc:  # capacity never raises: a store that is down is asked again later
            self._recalled = False
            log.warning("windows learned from overflow errors could not be read: %s", exc)

    async def capacity(self, route: Route) -> Capacity:
        profile = self.settings.providers.get(route.provider)
        if profile is None:
            return UNKNOWN_CAPACITY
        await self._recall()
        learned = self._learned.get((route.provider, route.model))
        if learned is not None:  # the provider's own refusal outranks configuration and metadata
            return Capacity(learned, "provider_error")
        configured = _config_capacity(profile, route.model)
        if configured is not None:
            return configured
        if not profile.discover_window or route.provider not in self.providers:
            return UNKNOWN_CAPACITY
        key = (route.provider, route.model)
        window = self._window(key)
        if window is not None:  # most turns: no lock (a lock handed over costs a loop iteration each)
            return window
        async with self._discovering.hold(key):  # concurrent turns on one route ask the provider once
            window = self._window(key)
            if window is None:
                window = await self._discover(route)
                self._remember(key, (window, time.monotonic() + UNKNOWN_RETRY_SECONDS))
            return window

    def discovered(self, route: Route, tokens: int) -> None:
        """A window the provider named outside discovery (a count endpoint's answer: vLLM's
        ``max_model_len``, llama.cpp's ``n_ctx``), kept as discovery keeps its answer."""
        if tokens > 0:
            self._remember((route.provider, route.model), (Capacity(tokens, "provider"), time.monotonic()))

    def _window(self, key: tuple[str, str]) -> Capacity | None:
        """The window discovered for ``key``: a known one is kept, "unknown" only until it is asked
        again (the provider's server may come up)."""
        cached = self._windows.get(key)
        if cached is None or (not cached[0].known and time.monotonic() >= cached[1]):
            return None
        self._windows.move_to_end(key)
        return cached[0]

    def _remember(self, key: tuple[str, str], answer: tuple[Capacity, float]) -> None:
        self._windows[key] = answer
        self._windows.move_to_end(key)
        while len(self._windows) > self.cache_entries:
            self._windows.popitem(last=False)

    async def _discover(self, route: Route) -> Capacity:
        provider = self.providers[route.provider]
        try:
            info = await provider.context_window(route.model)
        except Exception as exc:  # a metadata failure must never fail a turn
            log.warning("context window discovery for %s failed: %s", route.name, exc)
            return UNKNOWN_CAPACITY
        if info is None or info.tokens <= 0:
            return UNKNOWN_CAPACITY
        return Capacity(info.tokens, "provider")

    def budget(self, capacity: Capacity) -> int:
        return effective_context_budget(self.settings.runtime, capacity.window)

    def cost(self, route: Route, input_tokens: int, output_tokens: int) -> float | None:
        """USD for one call from the profile's per-million prices; None when there is nothing to price."""
        profile = self.settings.providers.get(route.provider)
        if profile is None:
            return None
        price_in, price_out = profile.price_input_per_mtok, profile.price_output_per_mtok
        input_tokens, output_tokens = max(0, input_tokens), max(0, output_tokens)
        if (price_in <= 0 and price_out <= 0) or (input_tokens == 0 and output_tokens == 0):
            return None
        return (input_tokens * price_in + output_tokens * price_out) / 1_000_000
