"""Settings: one declarative table, read once from a TOML file and the environment.

Every scalar setting of ``[server]``, ``[live]``, ``[runtime]``, ``[runtime.history_pruning]`` and
``[runtime.compaction]`` can be overridden by ``METERCHAT_<SECTION>_<KEY>`` (dots in the section
become underscores, e.g. ``METERCHAT_RUNTIME_HISTORY_PRUNING_ENABLED``); ``METERCHAT_DATA_DIR`` and
``METERCHAT_DEFAULT_ROUTE`` are short forms. A bad file stops start-up with a ``ConfigError`` naming
the key. With no file and no providers, the embedded offline ``demo`` provider is the default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.errors import ConfigError

PROVIDER_KINDS = ("openai", "anthropic", "ollama", "demo")
COMPACTION_STRATEGIES = ("none", "truncation", "summarization")


@dataclass(frozen=True)
class Setting:
    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str


# section -> settings; ``None`` default means "unset" (distinct from an explicit value).
SCHEMA: dict[str, tuple[Setting, ...]] = {
    "server": (
        Setting("host", str, "127.0.0.1", "Interface to listen on."),
        Setting("port", int, 8000, "TCP port."),
        Setting("data_dir", str, "meterchat-data", "Folder of the embedded SQLite store."),
        Setting("auth_token", str, "", "When set, /ws, /events and /api need this bearer token."),
        Setting("allowed_origins", list, [], "Extra Origin values allowed to open /ws."),
        Setting("coalesce_ms", int, 0, "Join chunk frames arriving within this many ms; 0 = off."),
        Setting("store_flush_ms", int, 250, "How often a streaming reply is written to the store."),
        Setting("keep_generating", bool, True, "Keep generating when the browser disconnects."),
    ),
    "live": (
        Setting("url", str, "", "redis://HOST:PORT/DB shared by every instance; empty = in-process."),
        Setting("lease_ttl_ms", int, 10000, "A turn's lease; an instance silent this long is taken over."),
        Setting("stream_max_frames", int, 10000, "Frames kept per session stream (MAXLEN ~) for resume."),
    ),
    "runtime": (
        Setting("max_context_tokens", int, None, "Absolute token budget; 0 disables proactive trimming."),
        Setting("context_compact_ratio", float, None, "Model-relative budget; outside (0, 1] = unset."),
        Setting("max_history_messages", int, None, "Whole-turn limit (legacy name); default 50."),
        Setting("max_tool_iterations", int, 10, "Provider calls with tools per turn."),
        Setting("max_tool_result_chars", int, 50000, "Cap per tool result when recorded; 0 = none."),
        Setting("image_token_cost", int, 1000, "Fixed token estimate per image actually sent."),
        Setting("max_image_bytes", int, 5 * 1024 * 1024, "Largest decoded image accepted."),
        Setting("max_output_tokens", int, 1024, "max_tokens asked of providers that need one."),
        Setting("system_prompt", str, "", "Leading system message of every session."),
    ),
    "runtime.history_pruning": (
        Setting("enabled", bool, False, "Lower the budget to max_tokens."),
        Setting("max_tokens", int, 8192, "Pruning cap; lowers, never raises, the budget."),
    ),
    "runtime.compaction": (
        Setting("strategy", str, "none", "none | truncation | summarization (group compaction)."),
        Setting("tokens_exceed", int, 0, "Trigger: compact when sent tokens exceed this; 0 = off."),
        Setting("target_tokens", int, None, "Stop when at or below this (0 < target <= trigger); "
                "unset: stop once the count no longer exceeds the trigger."),
        Setting("minimum_preserved_groups", int, 4, "Newest non-system groups always kept."),
    ),
}

PROVIDER_SCHEMA: tuple[Setting, ...] = (
    Setting("kind", str, None, "openai | anthropic | ollama | demo."),
    Setting("base_url", str, "", "Endpoint root, e.g. http://127.0.0.1:11434/v1 for OpenAI style."),
    Setting("api_key_env", str, "", "Name of the environment variable holding the key."),
    Setting("model", str, "", "The profile's configured model."),
    Setting("context_window", int, 0, "Capacity of that model; absent or 0 = unknown."),
    Setting("models", dict, {}, "Other models of this provider: name -> context window (0 = unknown)."),
    Setting("discover_window", bool, True, "Ask the provider's metadata for unknown windows."),
    Setting("price_input_per_mtok", float, 0.0, "USD per million input tokens (0 = no cost)."),
    Setting("price_output_per_mtok", float, 0.0, "USD per million output tokens."),
    Setting("timeout_seconds", float, 120.0, "Read timeout of one provider call."),
    Setting("delay_ms", int, 25, "demo only: pause between streamed pieces."),
    Setting("tools", bool, True, "Offer the built-in tools to this provider's models."),
    Setting("num_ctx", int, 0, "ollama only: options.num_ctx sent with each call; 0 = server default."),
)
ROUTE_SCHEMA: tuple[Setting, ...] = (
    Setting("hint", str, None, "Name a classifier rule or /hint prefix refers to."),
    Setting("provider", str, None, "Provider alias."),
    Setting("model", str, "", "Model; empty = the provider's model."),
)
RULE_SCHEMA: tuple[Setting, ...] = (
    Setting("hint", str, None, "Hint chosen when the rule matches."),
    Setting("keywords", list, [], "Case-insensitive substrings; any one matches."),
    Setting("patterns", list, [], "Case-sensitive substrings; any one matches."),
    Setting("min_length", int, 0, "Minimum message length in UTF-8 bytes."),
    Setting("max_length", int, 0, "Maximum message length in bytes; 0 = none."),
    Setting("priority", int, 0, "Higher rules are tried first; ties keep file order."),
)


@dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int
    data_dir: str
    auth_token: str
    allowed_origins: list[str]
    coalesce_ms: int
    store_flush_ms: int
    keep_generating: bool


@dataclass(frozen=True)
class LiveSettings:
    url: str = ""
    lease_ttl_ms: int = 10000
    stream_max_frames: int = 10000


@dataclass(frozen=True)
class HistoryPruning:
    enabled: bool = False
    max_tokens: int = 8192


@dataclass(frozen=True)
class CompactionSettings:
    strategy: str = "none"
    tokens_exceed: int = 0
    target_tokens: int | None = None
    minimum_preserved_groups: int = 4


@dataclass(frozen=True)
class RuntimeSettings:
    max_context_tokens: int | None = None
    context_compact_ratio: float | None = None
    max_history_messages: int | None = None
    max_tool_iterations: int = 10
    max_tool_result_chars: int = 50000
    image_token_cost: int = 1000
    max_image_bytes: int = 5 * 1024 * 1024
    max_output_tokens: int = 1024
    system_prompt: str = ""
    history_pruning: HistoryPruning = field(default_factory=HistoryPruning)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)

    @property
    def turn_limit(self) -> int:
        return 50 if self.max_history_messages is None else self.max_history_messages


@dataclass(frozen=True)
class ProviderProfile:
    alias: str
    kind: str
    base_url: str = ""
    api_key_env: str = ""
    model: str = ""
    context_window: int = 0
    models: dict[str, int] = field(default_factory=dict)
    discover_window: bool = True
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    timeout_seconds: float = 120.0
    delay_ms: int = 25
    tools: bool = True
    num_ctx: int = 0

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


@dataclass(frozen=True)
class ModelRoute:
    hint: str
    provider: str
    model: str = ""


@dataclass(frozen=True)
class ClassifierRule:
    hint: str
    keywords: list[str] = field(default_factory=list)
    patterns: list[str] = field(default_factory=list)
    min_length: int = 0
    max_length: int = 0
    priority: int = 0


@dataclass(frozen=True)
class Settings:
    server: ServerSettings
    runtime: RuntimeSettings
    providers: dict[str, ProviderProfile]
    default_route: str
    model_routes: list[ModelRoute]
    classifier_rules: list[ClassifierRule]
    source: str = "embedded default"
    live: LiveSettings = field(default_factory=LiveSettings)


# The embedded default's hint, so the README's `/hint open ...` works on a fresh start.
DEMO_ROUTES = ({"hint": "open", "provider": "demo", "model": "demo-open"},)
DEMO_PROFILE = ProviderProfile(
    alias="demo", kind="demo", model="demo-small", context_window=4096, models={"demo-open": 0}
)


def _check_type(key: str, value: Any, setting: Setting) -> Any:
    expected = setting.type
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if not isinstance(value, expected):
        name = expected.__name__ if isinstance(expected, type) else "value"
        raise ConfigError(f"{key}: expected {name}, got {type(value).__name__} {value!r}")
    return value


def _read_table(prefix: str, table: Mapping[str, Any], schema: tuple[Setting, ...],
                skip: tuple[str, ...] = ()) -> dict[str, Any]:
    known = {setting.name: setting for setting in schema}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in skip:
            continue
        if key not in known:
            raise ConfigError(f"{prefix}.{key}: unknown setting")
        values[key] = _check_type(f"{prefix}.{key}", value, known[key])
    for setting in schema:
        values.setdefault(setting.name, setting.default)
    return values


def _type_name(setting: Setting) -> str:
    kind = setting.type
    return kind.__name__ if isinstance(kind, type) else " or ".join(t.__name__ for t in kind)


def _env_value(raw: str, setting: Setting, name: str) -> Any:
    try:
        if setting.type is bool:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if setting.type is int:
            return int(raw)
        if setting.type is float:
            return float(raw)
        if setting.type is list:
            return [part.strip() for part in raw.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"{name}: cannot read {raw!r} as {_type_name(setting)}") from exc
    return raw


def env_name(section: str, key: str) -> str:
    return f"METERCHAT_{section.replace('.', '_').upper()}_{key.upper()}"


def _apply_env(section: str, values: dict[str, Any], env: Mapping[str, str]) -> None:
    for setting in SCHEMA[section]:
        name = env_name(section, setting.name)
        if name in env:
            values[setting.name] = _env_value(env[name], setting, name)


def _section(data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    node: Any = data
    for part in path.split("."):
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
        if not isinstance(node, Mapping):
            raise ConfigError(f"{path}: expected a table")
    return node


def _read_section(data: Mapping[str, Any], path: str, env: Mapping[str, str]) -> dict[str, Any]:
    subsections = tuple(p.split(".")[-1] for p in SCHEMA if p.startswith(path + "."))
    values = _read_table(path, _section(data, path), SCHEMA[path], skip=subsections)
    _apply_env(path, values, env)
    return values


def _read_providers(data: Mapping[str, Any]) -> dict[str, ProviderProfile]:
    providers: dict[str, ProviderProfile] = {}
    for alias, table in _section(data, "providers").items():
        prefix = f"providers.{alias}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{prefix}: expected a table")
        values = _read_table(prefix, table, PROVIDER_SCHEMA)
        if values["kind"] not in PROVIDER_KINDS:
            raise ConfigError(f"{prefix}.kind: expected one of {', '.join(PROVIDER_KINDS)}, "
                              f"got {values['kind']!r}")
        if values["kind"] in ("openai", "anthropic", "ollama") and not values["base_url"]:
            raise ConfigError(f"{prefix}.base_url: required for kind {values['kind']!r}")
        for model, window in values["models"].items():
            _check_type(f"{prefix}.models.{model}", window, Setting(model, int, 0, ""))
        providers[alias] = ProviderProfile(alias=alias, **values)
    return providers or {"demo": DEMO_PROFILE}


def _read_list(data: Mapping[str, Any], key: str, schema: tuple[Setting, ...],
               prefix: str = "") -> list[dict[str, Any]]:
    items = data.get(key, [])
    name = prefix + key
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise ConfigError(f"{name}: expected an array of tables")
    rows = []
    for index, item in enumerate(items):
        values = _read_table(f"{name}[{index}]", item, schema)
        for setting in schema:
            if setting.default is None and values[setting.name] is None:
                raise ConfigError(f"{name}[{index}].{setting.name}: required")
            if setting.type is list and not all(isinstance(v, str) for v in values[setting.name]):
                raise ConfigError(f"{name}[{index}].{setting.name}: expected a list of strings")
        rows.append(values)
    return rows


def check_route(route: str, providers: Mapping[str, ProviderProfile], key: str) -> None:
    alias = route.split("/", 1)[0]
    if alias not in providers:
        raise ConfigError(f"{key}: names provider {alias!r}, which is not configured "
                          f"(have: {', '.join(sorted(providers))})")


def settings_from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None,
                          source: str = "embedded default") -> Settings:
    env = os.environ if env is None else env
    allowed = {"server", "live", "runtime", "providers", "default_route", "model_routes", "classifier"}
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{key}: unknown setting")
    classifier = _section(data, "classifier")
    for key in classifier:
        if key != "rules":
            raise ConfigError(f"classifier.{key}: unknown setting")
    server = _read_section(data, "server", env)
    if "METERCHAT_DATA_DIR" in env:
        server["data_dir"] = env["METERCHAT_DATA_DIR"]
    runtime = _read_section(data, "runtime", env)
    runtime["history_pruning"] = HistoryPruning(**_read_section(data, "runtime.history_pruning", env))
    compaction = _read_section(data, "runtime.compaction", env)
    if compaction["strategy"] not in COMPACTION_STRATEGIES:
        raise ConfigError(f"runtime.compaction.strategy: expected one of "
                          f"{', '.join(COMPACTION_STRATEGIES)}, got {compaction['strategy']!r}")
    target, trigger = compaction["target_tokens"], compaction["tokens_exceed"]
    if target is not None and trigger > 0 and not 0 < target <= trigger:
        raise ConfigError(f"runtime.compaction.target_tokens: expected 0 < target_tokens <= tokens_exceed "
                          f"({trigger:,}), got {target:,}")
    runtime["compaction"] = CompactionSettings(**compaction)
    providers = _read_providers(data)
    default_route = env.get("METERCHAT_DEFAULT_ROUTE", data.get("default_route", next(iter(providers))))
    if not isinstance(default_route, str):
        raise ConfigError(f"default_route: expected str, got {default_route!r}")
    check_route(default_route, providers, "default_route")
    rows = _read_list(data, "model_routes", ROUTE_SCHEMA)
    if not rows and providers.get("demo") is DEMO_PROFILE:
        rows = [dict(row) for row in DEMO_ROUTES]
    routes = [ModelRoute(**row) for row in rows]
    for index, route in enumerate(routes):
        check_route(route.provider, providers, f"model_routes[{index}].provider")
    rules = [ClassifierRule(**row) for row in _read_list(classifier, "rules", RULE_SCHEMA, "classifier.")]
    return Settings(ServerSettings(**server), RuntimeSettings(**runtime), providers, default_route,
                    routes, rules, source, _read_live(data, env))


def _read_live(data: Mapping[str, Any], env: Mapping[str, str]) -> LiveSettings:
    live = _read_section(data, "live", env)
    for key in ("lease_ttl_ms", "stream_max_frames"):
        if live[key] <= 0:
            raise ConfigError(f"live.{key}: expected a positive integer, got {live[key]!r}")
    return LiveSettings(**live)


def load_settings(path: str | os.PathLike[str] | None = None,
                  env: Mapping[str, str] | None = None) -> Settings:
    if path is None:
        return settings_from_mapping({}, env)
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {file} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file}: {exc}") from exc
    return settings_from_mapping(data, env, source=str(file))
