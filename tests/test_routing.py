from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from server.config.load import settings_from_mapping
from server.config.settings import RuntimeSettings, Settings
from server.errors import ConfigError, UnknownRoute
from server.history.budget import FALLBACK_WINDOW
from server.providers.base import Provider, ProviderRequest, StreamEvent, TextDelta, WindowInfo
from server.routing import resolver as routing
from server.routing.resolver import Capacity, Route, RouteResolver


class CountingProvider:
    """A real Provider whose metadata answers from a table and counts how often it is asked."""

    kind = "openai"

    def __init__(self, windows: dict[str, int] | None = None, fail: bool = False) -> None:
        self.windows = windows or {}
        self.fail = fail
        self.asked: list[str] = []

    async def stream(self, request: ProviderRequest) -> AsyncIterator[StreamEvent]:
        yield TextDelta("ok")

    async def context_window(self, model: str) -> WindowInfo | None:
        self.asked.append(model)
        await anyio.sleep(0)  # a real server answers later: let other tasks run meanwhile
        if self.fail:
            raise ConnectionError("refused")
        tokens = self.windows.get(model)
        return None if tokens is None else WindowInfo(tokens, detail={"field": "max_model_len"})

    async def aclose(self) -> None:
        return None


CONFIG: dict[str, Any] = {
    "default_route": "local",
    "providers": {
        "local": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "model": "qwen",
                  "context_window": 8192, "models": {"llama": 4096, "phi": 0}},
        "openrouter": {"kind": "openai", "base_url": "http://127.0.0.1:2/v1",
                       "model": "meta-llama/llama-3-8b",
                       "price_input_per_mtok": 3.0, "price_output_per_mtok": 15.0},
        "strict": {"kind": "anthropic", "base_url": "http://127.0.0.1:3", "model": "claude",
                   "models": {"claude-big": 200000}, "discover_window": False},
        "demo": {"kind": "demo", "model": "demo-small", "context_window": 4096, "models": {"demo-open": 0}},
    },
    "model_routes": [
        {"hint": "fast", "provider": "local", "model": "llama"},
        {"hint": "big", "provider": "strict"},
        {"hint": "fast", "provider": "demo"},
    ],
    "classifier": {"rules": [{"hint": "fast", "keywords": ["quick"]},
                             {"hint": "nowhere", "keywords": ["odd"]}]},
}


def make_settings(**overrides: Any) -> Settings:
    return settings_from_mapping({**CONFIG, **overrides}, env={})


def make_resolver(live: dict[str, Provider] | None = None, **overrides: Any) -> RouteResolver:
    return RouteResolver(make_settings(**overrides), live or {})


def test_route_name_and_frame_fields() -> None:
    route = Route("openrouter", "meta-llama/llama-3-8b", "hint", "fast")
    assert route.name == "openrouter/meta-llama/llama-3-8b"
    assert route.fields() == {"provider": "openrouter", "model": "meta-llama/llama-3-8b",
                              "route_kind": "hint", "hint": "fast"}
    assert "hint" not in Route("local", "qwen", "default").fields()


def test_route_rejects_empty_model_and_unknown_kind() -> None:
    with pytest.raises(ValueError, match="model"):
        Route("local", "")
    with pytest.raises(ValueError, match="kind"):
        Route("local", "qwen", "sideways")


def test_resolver_routes_lists_default_first_without_duplicates() -> None:
    resolver = make_resolver(default_route="local/llama")
    assert resolver.routes() == [
        "local/llama", "local/qwen", "local/phi", "openrouter/meta-llama/llama-3-8b",
        "strict/claude", "strict/claude-big", "demo/demo-small", "demo/demo-open",
    ]


def test_resolver_parse_alias_only_uses_profile_model() -> None:
    assert make_resolver().parse("local") == Route("local", "qwen", "switch")


def test_resolver_parse_alias_and_model() -> None:
    assert make_resolver().parse("local/llama", kind="default") == Route("local", "llama", "default")


def test_resolver_parse_splits_on_first_slash_only() -> None:
    route = make_resolver().parse("openrouter/meta-llama/llama-3-8b")
    assert (route.provider, route.model) == ("openrouter", "meta-llama/llama-3-8b")


def test_resolver_parse_unknown_alias_names_what_exists() -> None:
    with pytest.raises(UnknownRoute) as caught:
        make_resolver().parse("nope/qwen")
    assert "'nope'" in caught.value.message
    assert "local" in caught.value.message and "openrouter" in caught.value.message


def test_resolver_parse_accepts_unlisted_model_when_discovery_is_on() -> None:
    assert make_resolver().parse("local/mistral") == Route("local", "mistral")


def test_resolver_parse_rejects_unlisted_model_when_list_is_authoritative() -> None:
    resolver = make_resolver()
    with pytest.raises(UnknownRoute) as caught:
        resolver.parse("strict/claude-tiny")
    assert "'claude-tiny'" in caught.value.message and "strict/claude-big" in caught.value.message
    with pytest.raises(UnknownRoute, match="demo/demo-small"):
        resolver.parse("demo/gpt-4")


def test_resolver_parse_alias_without_model_is_unknown_route() -> None:
    providers = {**CONFIG["providers"], "bare": {"kind": "openai", "base_url": "http://127.0.0.1:4/v1"}}
    resolver = make_resolver(providers=providers)
    with pytest.raises(UnknownRoute, match="bare/MODEL"):
        resolver.parse("bare")
    assert resolver.parse("bare/anything") == Route("bare", "anything")


def test_resolver_default_route_has_kind_default() -> None:
    assert make_resolver(default_route="openrouter").default_route() == Route(
        "openrouter", "meta-llama/llama-3-8b", "default")


def test_resolver_bad_model_route_is_config_error() -> None:
    with pytest.raises(ConfigError, match=r"model_routes\[0\]"):
        make_resolver(model_routes=[{"hint": "x", "provider": "strict", "model": "gone"}])


def test_for_message_without_hint_keeps_session_route() -> None:
    resolver = make_resolver()
    session = resolver.default_route()
    assert resolver.for_message(session, "hello there") == (session, "hello there")


def test_for_message_classifier_hint_resolves_route() -> None:
    resolver = make_resolver()
    session = resolver.default_route()
    route, text = resolver.for_message(session, "a QUICK question")
    assert route == Route("local", "llama", "hint", "fast")  # first model_routes entry for the hint
    assert text == "a QUICK question"
    assert session == Route("local", "qwen", "default")


def test_for_message_unknown_hint_falls_back_to_session_pair() -> None:
    resolver = make_resolver()
    session = resolver.parse("openrouter")
    route, _ = resolver.for_message(session, "an odd one")
    assert route == Route("openrouter", "meta-llama/llama-3-8b", "fallback", "nowhere")


def test_for_message_hint_prefix_is_stripped_and_beats_classifier() -> None:
    resolver = make_resolver()
    session = resolver.default_route()
    route, text = resolver.for_message(session, "/hint big a quick look please")
    assert route == Route("strict", "claude", "hint", "big")
    assert text == "a quick look please"


def test_for_message_hint_prefix_with_newline_and_without_rest() -> None:
    resolver = make_resolver()
    session = resolver.default_route()
    assert resolver.for_message(session, "/hint big\nline two")[1] == "line two"
    route, text = resolver.for_message(session, "/hint missing")
    assert (route.kind, route.hint, route.name, text) == ("fallback", "missing", "local/qwen", "")


def test_for_message_hint_word_must_be_a_prefix() -> None:
    resolver = make_resolver()
    session = resolver.default_route()
    assert resolver.for_message(session, "/hinted big") == (session, "/hinted big")
    assert resolver.for_message(session, "say /hint big") == (session, "say /hint big")


@pytest.mark.anyio
async def test_capacity_known_from_profile_context_window() -> None:
    capacity = await make_resolver().capacity(Route("local", "qwen"))
    assert (capacity.window, capacity.source) == (8192, "config")


@pytest.mark.anyio
async def test_capacity_known_from_models_table() -> None:
    capacity = await make_resolver().capacity(Route("local", "llama"))
    assert (capacity.window, capacity.source) == (4096, "config")


@pytest.mark.anyio
async def test_capacity_mismatched_model_never_borrows_profile_window() -> None:
    resolver = make_resolver(providers={**CONFIG["providers"],
                                        "local": {**CONFIG["providers"]["local"], "discover_window": False}})
    for model in ("mistral", "phi"):
        capacity = await resolver.capacity(Route("local", model))
        assert capacity == Capacity(None, None)
        assert not capacity.known


@pytest.mark.anyio
async def test_capacity_discovered_once_and_cached() -> None:
    provider = CountingProvider({"mistral": 32768})
    resolver = make_resolver({"local": provider})
    first = await resolver.capacity(Route("local", "mistral"))
    second = await resolver.capacity(Route("local", "mistral", "hint", "fast"))
    assert first == second == Capacity(32768, "provider")
    assert provider.asked == ["mistral"]


@pytest.mark.anyio
async def test_capacity_concurrent_turns_ask_once() -> None:
    provider = CountingProvider({"mistral": 32768})
    resolver = make_resolver({"local": provider})
    answers: list[Capacity] = []

    async def ask() -> None:
        answers.append(await resolver.capacity(Route("local", "mistral")))

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(ask)
    assert [answer.window for answer in answers] == [32768] * 3
    assert provider.asked == ["mistral"]


@pytest.mark.anyio
async def test_capacity_a_discovered_window_is_answered_without_waiting() -> None:
    # Every turn asks; once the window is known the answer takes no lock and never suspends (each
    # lock hand-over cost a loop iteration, so turns starting together queued one per iteration).
    provider = CountingProvider({"mistral": 32768})
    resolver = make_resolver({"local": provider})
    route = Route("local", "mistral")
    await resolver.capacity(route)
    asking = resolver.capacity(route)
    with pytest.raises(StopIteration) as answered:
        asking.send(None)
    assert answered.value.value == Capacity(32768, "provider")


@pytest.mark.anyio
async def test_capacity_config_answer_does_not_ask_provider() -> None:
    provider = CountingProvider({"qwen": 1})
    resolver = make_resolver({"local": provider})
    assert (await resolver.capacity(Route("local", "qwen"))).window == 8192
    assert provider.asked == []


@pytest.mark.anyio
async def test_capacity_none_answer_is_cached_until_the_retry_interval(monkeypatch) -> None:
    provider = CountingProvider({})
    resolver = make_resolver({"local": provider})
    route = Route("local", "mistral")
    assert await resolver.capacity(route) == Capacity(None, None)
    assert await resolver.capacity(route) == Capacity(None, None)
    assert provider.asked == ["mistral"]
    provider.windows["mistral"] = 16000
    later = time.monotonic() + routing.UNKNOWN_RETRY_SECONDS
    monkeypatch.setattr(routing.time, "monotonic", lambda: later)
    assert (await resolver.capacity(route)).window == 16000
    assert provider.asked == ["mistral", "mistral"]


@pytest.mark.anyio
async def test_capacity_never_raises_when_discovery_fails() -> None:
    provider = CountingProvider(fail=True)
    resolver = make_resolver({"local": provider})
    assert await resolver.capacity(Route("local", "mistral")) == Capacity(None, None)
    assert await resolver.capacity(Route("local", "mistral")) == Capacity(None, None)
    assert provider.asked == ["mistral"]


@pytest.mark.anyio
async def test_capacity_discovery_off_does_not_ask() -> None:
    provider = CountingProvider({"claude-x": 100})
    resolver = make_resolver({"strict": provider},
                             providers={**CONFIG["providers"], "strict": {**CONFIG["providers"]["strict"],
                                                                          "models": {}}})
    assert await resolver.capacity(Route("strict", "claude-x")) == Capacity(None, None)
    assert provider.asked == []


@pytest.mark.anyio
async def test_capacity_unknown_alias_is_unknown() -> None:
    assert await make_resolver().capacity(Route("ghost", "m")) == Capacity(None, None)


@pytest.mark.anyio
async def test_budget_follows_route_capacity() -> None:
    resolver = make_resolver()
    assert resolver.budget(await resolver.capacity(Route("local", "llama"))) == 4096
    assert resolver.budget(await resolver.capacity(Route("local", "qwen"))) == 8192
    assert resolver.budget(Capacity(None, None)) == FALLBACK_WINDOW


def test_budget_uses_runtime_settings() -> None:
    settings = make_settings(runtime={"context_compact_ratio": 0.5})
    resolver = RouteResolver(settings, {})
    assert isinstance(settings.runtime, RuntimeSettings)
    assert resolver.budget(Capacity(8192, "config")) == 4096


def test_cost_from_profile_prices() -> None:
    route = Route("openrouter", "meta-llama/llama-3-8b")
    cost = make_resolver().cost(route, 1_000_000, 2_000)
    assert cost == pytest.approx(3.0 + 0.03)


def test_cost_none_without_prices_or_tokens() -> None:
    resolver = make_resolver()
    assert resolver.cost(Route("local", "qwen"), 1000, 1000) is None
    assert resolver.cost(Route("openrouter", "meta-llama/llama-3-8b"), 0, 0) is None
    assert resolver.cost(Route("ghost", "m"), 10, 10) is None


def test_cost_follows_hint_route_not_session() -> None:
    resolver = make_resolver(model_routes=[{"hint": "pay", "provider": "openrouter"}],
                             classifier={"rules": [{"hint": "pay", "keywords": ["deep"]}]})
    session = resolver.default_route()
    route, _ = resolver.for_message(session, "think deep")
    assert resolver.cost(session, 1000, 0) is None
    assert resolver.cost(route, 1000, 0) == pytest.approx(0.003)


@pytest.mark.anyio
async def test_capacity_unknown_answer_is_asked_again_after_a_while(monkeypatch) -> None:
    provider = CountingProvider({})
    resolver = make_resolver({"local": provider})
    route = Route("local", "mistral")
    assert (await resolver.capacity(route)).window is None
    provider.windows["mistral"] = 16000
    assert (await resolver.capacity(route)).window is None  # within the retry interval: cached
    clock = time.monotonic() + routing.UNKNOWN_RETRY_SECONDS + 1
    monkeypatch.setattr(routing.time, "monotonic", lambda: clock)
    assert (await resolver.capacity(route)).window == 16000
    monkeypatch.setattr(routing.time, "monotonic", lambda: clock + 10 * routing.UNKNOWN_RETRY_SECONDS)
    assert (await resolver.capacity(route)).window == 16000 and provider.asked == ["mistral"] * 2
