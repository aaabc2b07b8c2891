"""Loading the settings: a TOML file and the environment, read once into ``config.Settings``.

Every scalar setting of ``[server]``, ``[store]``, ``[live]``, ``[auth]``, ``[runtime]``,
``[runtime.history_pruning]`` and ``[runtime.compaction]`` can be overridden by
``METERCHAT_<SECTION>_<KEY>`` (dots in the section become underscores, e.g.
``METERCHAT_RUNTIME_HISTORY_PRUNING_ENABLED``); ``METERCHAT_DATA_DIR`` and
``METERCHAT_DEFAULT_ROUTE`` are short forms. An unknown key or a bad value (``config_checks``)
stops start-up with a ``ConfigError`` naming the key. With no file and no providers, the embedded
offline ``demo`` provider is the default (``config_demo``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from server.config.checks import (
    POSITIVE_RUNTIME_SETTINGS,
    POSITIVE_SERVER_SETTINGS,
    check_auth,
    check_compaction,
    check_live,
    check_mcp_server,
    check_positive,
    check_provider,
    check_route,
    check_tool_selection,
    check_type,
)
from server.config.demo import providers_or_demo, routes_or_demo
from server.config.settings import (
    MCP_SERVER_SCHEMA,
    PROVIDER_SCHEMA,
    ROUTE_SCHEMA,
    RULE_SCHEMA,
    SCHEMA,
    AuthSettings,
    ClassifierRule,
    CompactionSettings,
    HistoryPruning,
    LiveSettings,
    McpServerSettings,
    ModelRoute,
    ProviderProfile,
    RuntimeSettings,
    ServerSettings,
    Setting,
    Settings,
    StoreSettings,
)
from server.errors import ConfigError

TOP_LEVEL_KEYS = {"server", "store", "live", "auth", "runtime", "providers", "default_route", "model_routes",
                  "classifier", "mcp_servers"}


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


def settings_from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None,
                          source: str = "embedded default") -> Settings:
    env = os.environ if env is None else env
    classifier = _top_level(data)
    server = _read_server(data, env)
    runtime = _read_runtime(data, env)
    providers = _read_providers(data)
    default_route = _read_default_route(data, env, providers)
    routes = _read_routes(data, providers)
    rules = [ClassifierRule(**row) for row in _read_list(classifier, "rules", RULE_SCHEMA, "classifier.")]
    mcp_servers = _read_mcp_servers(data)
    for alias, profile in providers.items():
        check_tool_selection(f"providers.{alias}.tools", profile.tools, mcp_servers)
    return Settings(server, runtime, providers, default_route, routes, rules, source,
                    StoreSettings(**_read_section(data, "store", env)), _read_live(data, env), mcp_servers,
                    _read_auth(data, env, server.auth_token))


def _top_level(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Refuse unknown top-level keys and classifier keys; the ``[classifier]`` table."""
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise ConfigError(f"{key}: unknown setting")
    classifier = _section(data, "classifier")
    for key in classifier:
        if key != "rules":
            raise ConfigError(f"classifier.{key}: unknown setting")
    return classifier


def _read_server(data: Mapping[str, Any], env: Mapping[str, str]) -> ServerSettings:
    server = _read_section(data, "server", env)
    check_positive("server", server, POSITIVE_SERVER_SETTINGS)
    if "METERCHAT_DATA_DIR" in env:
        server["data_dir"] = env["METERCHAT_DATA_DIR"]
    return ServerSettings(**server)


def _read_runtime(data: Mapping[str, Any], env: Mapping[str, str]) -> RuntimeSettings:
    runtime = _read_section(data, "runtime", env)
    check_positive("runtime", runtime, POSITIVE_RUNTIME_SETTINGS)
    runtime["history_pruning"] = HistoryPruning(**_read_section(data, "runtime.history_pruning", env))
    compaction = _read_section(data, "runtime.compaction", env)
    check_compaction(compaction)
    runtime["compaction"] = CompactionSettings(**compaction)
    return RuntimeSettings(**runtime)


def _named_tables(data: Mapping[str, Any], section: str, schema: tuple[Setting, ...]
                  ) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``[section.NAME]`` tables: each name, its key prefix and its values read against ``schema``."""
    for name, table in _section(data, section).items():
        prefix = f"{section}.{name}"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{prefix}: expected a table")
        yield name, prefix, _read_table(prefix, table, schema)


def _read_providers(data: Mapping[str, Any]) -> dict[str, ProviderProfile]:
    providers: dict[str, ProviderProfile] = {}
    for alias, prefix, values in _named_tables(data, "providers", PROVIDER_SCHEMA):
        check_provider(prefix, values)
        providers[alias] = ProviderProfile(alias=alias, **values)
    return providers_or_demo(providers)


def _read_mcp_servers(data: Mapping[str, Any]) -> dict[str, McpServerSettings]:
    servers: dict[str, McpServerSettings] = {}
    for name, prefix, values in _named_tables(data, "mcp_servers", MCP_SERVER_SCHEMA):
        check_mcp_server(prefix, name, values)
        servers[name] = McpServerSettings(name=name, **values)
    return servers


def _read_default_route(data: Mapping[str, Any], env: Mapping[str, str],
                        providers: Mapping[str, ProviderProfile]) -> str:
    default_route = env.get("METERCHAT_DEFAULT_ROUTE", data.get("default_route", next(iter(providers))))
    if not isinstance(default_route, str):
        raise ConfigError(f"default_route: expected str, got {default_route!r}")
    check_route(default_route, providers, "default_route")
    return default_route


def _read_routes(data: Mapping[str, Any], providers: Mapping[str, ProviderProfile]) -> list[ModelRoute]:
    routes = [ModelRoute(**row) for row in routes_or_demo(_read_list(data, "model_routes", ROUTE_SCHEMA),
                                                           providers)]
    for index, route in enumerate(routes):
        check_route(route.provider, providers, f"model_routes[{index}].provider")
    return routes


def _read_live(data: Mapping[str, Any], env: Mapping[str, str]) -> LiveSettings:
    live = _read_section(data, "live", env)
    check_live(live)
    return LiveSettings(**live)


def _read_auth(data: Mapping[str, Any], env: Mapping[str, str], auth_token: str) -> AuthSettings:
    auth = _read_section(data, "auth", env)
    check_auth(auth, auth_token)
    return AuthSettings(**auth)


# --- tables ---------------------------------------------------------------------------------------

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


def _read_table(prefix: str, table: Mapping[str, Any], schema: tuple[Setting, ...],
                skip: tuple[str, ...] = ()) -> dict[str, Any]:
    known = {setting.name: setting for setting in schema}
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in skip:
            continue
        if key not in known:
            raise ConfigError(f"{prefix}.{key}: unknown setting")
        values[key] = check_type(f"{prefix}.{key}", value, known[key])
    for setting in schema:
        values.setdefault(setting.name, setting.default)
    return values


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


# --- the environment ------------------------------------------------------------------------------

def env_name(section: str, key: str) -> str:
    return f"METERCHAT_{section.replace('.', '_').upper()}_{key.upper()}"


def _apply_env(section: str, values: dict[str, Any], env: Mapping[str, str]) -> None:
    for setting in SCHEMA[section]:
        name = env_name(section, setting.name)
        if name in env:
            values[setting.name] = _env_value(env[name], setting, name)


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


def _type_name(setting: Setting) -> str:
    kind = setting.type
    return kind.__name__ if isinstance(kind, type) else " or ".join(t.__name__ for t in kind)
