"""The rules a setting's value must follow beyond its key being known.

A value of the wrong type, a bound of 0 where 0 would refuse everything, a provider kind or a
compaction strategy that does not exist, a route naming a provider that is not configured: each is
a ``ConfigError`` naming the key, so start-up says which line of the file to fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from server.config.settings import McpServerSettings, ProviderProfile, Setting
from server.errors import ConfigError

PROVIDER_KINDS = ("openai", "anthropic", "ollama", "demo")
COUNT_ENDPOINT = ("auto", "off")
COMPACTION_STRATEGIES = ("none", "truncation", "summarization")

# Server bounds that must be positive (idle_timeout_seconds takes 0 for "never").
POSITIVE_SERVER_SETTINGS = ("max_outbox_bytes", "max_connections", "hello_timeout_seconds", "frame_rate",
                            "frame_burst", "header_timeout_seconds", "max_header_bytes",
                            "history_page_messages", "route_cache_entries", "max_import_bytes")
# Provider limits that must be positive: 0 would mean "never" or "nothing", not "off".
POSITIVE_PROVIDER_SETTINGS = ("idle_timeout_seconds", "max_line_bytes", "max_connections",
                              "pool_timeout_seconds")
# Reply bounds: 0 would refuse every reply, not lift the bound.
POSITIVE_RUNTIME_SETTINGS = ("max_reply_chars", "max_tool_argument_chars")
POSITIVE_LIVE_SETTINGS = ("lease_ttl_ms", "stream_max_frames", "coalesce_bytes")
POSITIVE_MCP_SETTINGS = ("start_timeout_seconds", "call_timeout_seconds", "max_tools", "max_schema_bytes",
                         "max_result_bytes")
APPROVALS = ("never", "always")
MCP_SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}\Z")


def check_type(key: str, value: Any, setting: Setting) -> Any:
    """``value`` as ``setting`` takes it (an int where a float goes becomes a float)."""
    expected = setting.type
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is int and isinstance(value, bool):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if not isinstance(value, expected):
        name = expected.__name__ if isinstance(expected, type) else "value"
        raise ConfigError(f"{key}: expected {name}, got {type(value).__name__} {value!r}")
    return value


def check_positive(prefix: str, values: Mapping[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:  # a zero bound would refuse everything, not switch it off
        if values[key] <= 0:
            raise ConfigError(f"{prefix}.{key}: must be greater than 0, got {values[key]!r}")


def check_provider(prefix: str, values: Mapping[str, Any]) -> None:
    if values["kind"] not in PROVIDER_KINDS:
        raise ConfigError(f"{prefix}.kind: expected one of {', '.join(PROVIDER_KINDS)}, "
                          f"got {values['kind']!r}")
    if values.get("count_endpoint", "auto") not in COUNT_ENDPOINT:
        raise ConfigError(f"{prefix}.count_endpoint: expected one of {', '.join(COUNT_ENDPOINT)}, "
                          f"got {values['count_endpoint']!r}")
    if values["kind"] in ("openai", "anthropic", "ollama") and not values["base_url"]:
        raise ConfigError(f"{prefix}.base_url: required for kind {values['kind']!r}")
    check_positive(prefix, values, POSITIVE_PROVIDER_SETTINGS)
    for model, window in values["models"].items():
        check_type(f"{prefix}.models.{model}", window, Setting(model, int, 0, ""))


def check_compaction(compaction: Mapping[str, Any]) -> None:
    if compaction["strategy"] not in COMPACTION_STRATEGIES:
        raise ConfigError(f"runtime.compaction.strategy: expected one of "
                          f"{', '.join(COMPACTION_STRATEGIES)}, got {compaction['strategy']!r}")
    target, trigger = compaction["target_tokens"], compaction["tokens_exceed"]
    if target is not None and trigger > 0 and not 0 < target <= trigger:
        raise ConfigError(f"runtime.compaction.target_tokens: expected 0 < target_tokens <= tokens_exceed "
                          f"({trigger:,}), got {target:,}")


def check_live(live: Mapping[str, Any]) -> None:
    for key in POSITIVE_LIVE_SETTINGS:
        if live[key] <= 0:
            raise ConfigError(f"live.{key}: expected a positive integer, got {live[key]!r}")
    if live["coalesce_ms"] < 0:
        raise ConfigError(f"live.coalesce_ms: expected 0 or more, got {live['coalesce_ms']!r}")


def check_route(route: str, providers: Mapping[str, ProviderProfile], key: str) -> None:
    alias = route.split("/", 1)[0]
    if alias not in providers:
        raise ConfigError(f"{key}: names provider {alias!r}, which is not configured "
                          f"(have: {', '.join(sorted(providers))})")


def check_mcp_server(prefix: str, name: str, values: Mapping[str, Any]) -> None:
    """One transport (``command`` or ``url``), known approvals, positive bounds, string maps."""
    if not MCP_SERVER_NAME.match(name) or "__" in name:
        # The first "__" of a model-facing name ends the server's name: names stay unique across servers.
        raise ConfigError(f"{prefix}: a server name is 1 to 32 letters, digits, _ or - without \"__\" "
                          f"(it prefixes the tool names the model sees)")
    if bool(values["command"]) == bool(values["url"]):
        raise ConfigError(f"{prefix}: set exactly one of command (stdio) or url (Streamable HTTP)")
    if values["url"] and not values["url"].startswith(("http://", "https://")):
        raise ConfigError(f"{prefix}.url: expected an http:// or https:// URL, got {values['url']!r}")
    check_positive(prefix, values, POSITIVE_MCP_SETTINGS)
    for key in ("args",):
        if not all(isinstance(item, str) for item in values[key]):
            raise ConfigError(f"{prefix}.{key}: expected a list of strings")
    for key in ("env", "headers_env", "approve_tools"):
        for item, value in values[key].items():
            check_type(f"{prefix}.{key}.{item}", value, Setting(item, str, "", ""))
    for key, value in [("approve", values["approve"]),
                       *((f"approve_tools.{t}", v) for t, v in values["approve_tools"].items())]:
        if value not in APPROVALS:
            raise ConfigError(f"{prefix}.{key}: expected one of {', '.join(APPROVALS)}, got {value!r}")


def check_tool_selection(key: str, tools: bool | list[str],
                         servers: Mapping[str, McpServerSettings]) -> None:
    """A list names configured servers (``name``) or their tools (``name/tool``)."""
    if isinstance(tools, bool):
        return
    for item in tools:
        if not isinstance(item, str):
            raise ConfigError(f"{key}: expected true, false or a list of strings, got {item!r}")
        server = item.split("/", 1)[0]
        if server not in servers:
            known = ", ".join(servers) or "none configured"
            raise ConfigError(f"{key}: {item!r} names no [mcp_servers] server (configured: {known})")


AUTH_MODES = ("none", "token", "accounts", "header")


def check_auth(auth: Mapping[str, Any], auth_token: str) -> None:
    mode = auth["mode"]
    if mode and mode not in AUTH_MODES:
        raise ConfigError(f"auth.mode: expected one of {', '.join(AUTH_MODES)}, got {mode!r}")
    if mode == "token" and not auth_token:
        raise ConfigError("auth.mode: token needs server.auth_token (METERCHAT_SERVER_AUTH_TOKEN)")
    if mode == "header" and not auth["trusted_proxies"]:
        raise ConfigError("auth.trusted_proxies: header mode needs the proxy's address (e.g. 127.0.0.1)")
    if mode == "header" and not auth["user_header"].strip():
        raise ConfigError("auth.user_header: header mode needs a header name")
    if auth["oidc_issuer"] and mode != "accounts":
        raise ConfigError("auth.oidc_issuer: single sign-on needs mode = \"accounts\"")
    if auth["oidc_issuer"] and not auth["oidc_client_id"]:
        raise ConfigError("auth.oidc_client_id: required with auth.oidc_issuer")
    if auth["daily_tokens"] < 0:
        raise ConfigError(f"auth.daily_tokens: expected 0 (no budget) or more, got {auth['daily_tokens']!r}")
    for key in ("session_days", "signin_attempts", "revocation_check_ms", "user_turns", "user_frame_rate",
                "user_frame_burst"):
        if auth[key] <= 0:
            raise ConfigError(f"auth.{key}: must be greater than 0, got {auth[key]!r}")
