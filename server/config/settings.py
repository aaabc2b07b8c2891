"""Settings: one declarative table, the frozen dataclasses every part of the server reads.

The settings dataclasses are the table: each field that is a setting carries its default and its
help (``setting(...)``, ``required(...)``), and ``SCHEMA`` and the other schemas are read from them,
so a default is written in one place. ``config_load.load_settings`` fills them from a TOML file and
the ``METERCHAT_*`` environment, ``config_checks`` holds the rules a value must follow and
``config_demo`` the embedded offline profile used when no provider is configured.

It imports no other server module: the pure history engine reads its settings from here.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, Field, dataclass, field, fields
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints


@dataclass(frozen=True)
class Setting:
    name: str
    type: type | tuple[type, ...]
    default: Any
    help: str


def setting(default: Any, help: str) -> Any:
    """A field of a settings dataclass: its default and its help, the one place both are written.
    A ``None`` default means "unset" (distinct from an explicit value)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def required(help: str) -> Any:
    """A field with no default: a table that leaves it out is refused."""
    return field(metadata={"help": help})


@dataclass(frozen=True)
class ServerSettings:
    host: str = setting("127.0.0.1", "Interface to listen on.")
    port: int = setting(8000, "TCP port.")
    data_dir: str = setting("meterchat-data", "Folder of the embedded SQLite store.")
    auth_token: str = setting("", "When set, /ws, /events and /api need this bearer token.")
    allowed_hosts: list[str] = setting([], "Extra Host names served (*.example.com matches subdomains).")
    allowed_origins: list[str] = setting([], "Extra Origin values allowed to open /ws and change /api.")
    coalesce_ms: int = setting(0, "Wait this many ms to join chunk frames; 0 = no wait (chunks that "
                               "pile up while the server is busy are joined anyway).")
    max_outbox_bytes: int = setting(8 * 1024 * 1024, "A client this many bytes behind is closed (1008); "
                                    "it resumes by seq when it reconnects.")
    store_flush_ms: int = setting(250, "How often a streaming reply is written to the store.")
    keep_generating: bool = setting(True, "Keep generating when the browser disconnects.")
    # Bounds: each a safe default (issue 9); 0 is refused where it would mean "nothing allowed".
    max_connections: int = setting(2000, "Open /ws connections at once; one more is closed with 1013.")
    hello_timeout_seconds: float = setting(10.0, "A /ws connection with no hello this long is closed.")
    idle_timeout_seconds: float = setting(3600.0, "Close /ws (1001) after this long without a client frame "
                                          "while no reply streams; 0 = never.")
    frame_rate: float = setting(20.0, "Client frames per second a connection may send (token bucket).")
    frame_burst: int = setting(60, "Client frames a connection may send at once above frame_rate.")
    header_timeout_seconds: float = setting(10.0, "Each HTTP request head must arrive within this.")
    max_header_bytes: int = setting(64 * 1024, "Largest HTTP request head accepted.")
    shutdown_grace_seconds: float = setting(5.0, "SIGTERM: time to store replies and close streams.")
    history_page_messages: int = setting(200, "Messages per history page; older ones on history_before.")
    max_import_bytes: int = setting(32 * 1024 * 1024, "Largest session import (an exported JSON file, "
                                    "images inlined): raise it for sessions with many images.")
    metrics: bool = setting(False, "Serve /metrics (Prometheus text format), behind the same auth as /api.")
    route_cache_entries: int = setting(512, "Routes whose discovered window and calibration are kept (LRU).")


@dataclass(frozen=True)
class StoreSettings:
    url: str = setting("", "postgresql://USER@HOST:PORT/DB for the shared store; empty = SQLite.")
    pool_size: int = setting(10, "Most PostgreSQL connections one server holds.")
    timeout_seconds: float = setting(10.0, "How long a write waits (PostgreSQL, or a locked SQLite file).")


@dataclass(frozen=True)
class LiveSettings:
    url: str = setting("", "redis://HOST:PORT/DB shared by every instance; empty = in-process.")
    lease_ttl_ms: int = setting(10000, "A turn's lease; an instance silent this long is taken over.")
    stream_max_frames: int = setting(10000, "Frames kept per session stream (MAXLEN ~) for resume.")
    coalesce_ms: int = setting(0, "Wait this many ms before publishing, to join a session's chunk frames; "
                                  "0 = no wait (chunks queued during the previous append are joined anyway).")
    coalesce_bytes: int = setting(16384, "The most text one joined chunk frame carries to Redis.")


@dataclass(frozen=True)
class AuthSettings:
    mode: str = setting("", "none | token | accounts | header; empty = token when server.auth_token "
                        "is set, else none.")
    user_header: str = setting("X-Forwarded-User", "header mode: the header naming the signed-in user.")
    trusted_proxies: list[str] = setting([], "header mode: proxy addresses or networks (CIDR) whose "
                                         "user_header is believed; every other peer is refused.")
    session_days: float = setting(14.0, "accounts mode: a sign-in lasts this long.")
    signin_attempts: int = setting(5, "Failed sign-ins per minute per address and name before 429.")
    revocation_check_ms: int = setting(500, "How often open sockets' sign-ins are checked against "
                                       "the store (sign-out, disable, password change).")
    user_turns: int = setting(4, "Replies one user may have being written at once (per instance).")
    user_frame_rate: float = setting(40.0, "Client frames a second one user may send over all their "
                                     "sockets (per instance; token bucket).")
    user_frame_burst: int = setting(120, "Client frames one user may send at once above user_frame_rate.")
    daily_tokens: int = setting(0, "Tokens (input + output) one user may spend per UTC day; 0 = no "
                                "budget. The meter shows what is left.")
    oidc_issuer: str = setting("", "accounts mode: an OpenID Connect issuer URL; adds single sign-on.")
    oidc_client_id: str = setting("", "OIDC: this server's client id at the issuer.")
    oidc_client_secret_env: str = setting("METERCHAT_OIDC_CLIENT_SECRET",
                                          "OIDC: the environment variable holding the client secret.")
    oidc_scopes: str = setting("openid email profile", "OIDC: the scopes asked for.")
    oidc_admin_claim: str = setting("", "OIDC: a claim that makes an admin (e.g. groups); empty = "
                                    "the first account is the admin.")
    oidc_admin_values: list[str] = setting(["admin"], "OIDC: values of oidc_admin_claim that make an "
                                           "admin (a claim of true does too).")

    @property
    def oidc_client_secret(self) -> str:
        return os.environ.get(self.oidc_client_secret_env, "") if self.oidc_client_secret_env else ""

    def effective_mode(self, auth_token: str) -> str:
        """The mode in force: the setting, or ``token``/``none`` by whether a token is set."""
        return self.mode or ("token" if auth_token else "none")


@dataclass(frozen=True)
class HistoryPruning:
    enabled: bool = setting(False, "Lower the budget to max_tokens.")
    max_tokens: int = setting(8192, "Pruning cap; lowers, never raises, the budget.")


@dataclass(frozen=True)
class CompactionSettings:
    strategy: str = setting("none", "none | truncation | summarization (group compaction).")
    tokens_exceed: int = setting(0, "Trigger: compact when sent tokens exceed this; 0 = off.")
    target_tokens: int | None = setting(None, "Stop when at or below this (0 < target <= trigger); "
                                        "unset: stop once the count no longer exceeds the trigger.")
    minimum_preserved_groups: int = setting(4, "Newest non-system groups always kept.")


@dataclass(frozen=True)
class RuntimeSettings:
    max_context_tokens: int | None = setting(None, "Absolute token budget; 0 disables proactive trimming.")
    context_compact_ratio: float | None = setting(None, "Model-relative budget; outside (0, 1] = unset.")
    max_history_messages: int | None = setting(None, "Whole-turn limit (legacy name); default 50.")
    max_tool_iterations: int = setting(10, "Provider calls with tools per turn.")
    max_tool_result_chars: int = setting(50000, "Cap per tool result when recorded; 0 = none.")
    tool_approval_timeout_seconds: float = setting(
        600.0, "A call waiting for the page's approval (approve = \"always\") this long is denied.")
    image_token_cost: int = setting(1000, "Fixed token estimate per image actually sent.")
    max_image_bytes: int = setting(5 * 1024 * 1024, "Largest decoded image accepted.")
    max_output_tokens: int = setting(1024, "max_tokens asked of providers that need one.")
    max_reply_chars: int = setting(4 * 1024 * 1024, "Most characters one provider call may stream (text, "
                                   "thinking and tool-call arguments together); past it the call ends "
                                   "with reply_too_large, the reply so far kept.")
    max_tool_argument_chars: int = setting(1024 * 1024, "Most characters of one tool call's arguments; "
                                           "past it the call ends with reply_too_large.")
    reply_reserve_tokens: int = setting(0, "Tokens kept free for the reply (meter, trims, capacity check).")
    system_prompt: str = setting("", "Leading system message of every session.")
    # subsections: their own tables, [runtime.history_pruning] and [runtime.compaction]
    history_pruning: HistoryPruning = field(default_factory=HistoryPruning)
    compaction: CompactionSettings = field(default_factory=CompactionSettings)

    @property
    def turn_limit(self) -> int:
        return 50 if self.max_history_messages is None else self.max_history_messages


@dataclass(frozen=True)
class ProviderProfile:
    alias: str  # the table's name, not a setting
    kind: str = required("openai | anthropic | ollama | demo.")
    base_url: str = setting("", "Endpoint root, e.g. http://127.0.0.1:11434/v1 for OpenAI style.")
    api_key_env: str = setting("", "Name of the environment variable holding the key.")
    model: str = setting("", "The profile's configured model.")
    context_window: int = setting(0, "Capacity of that model; absent or 0 = unknown.")
    models: dict[str, int] = setting(
        {}, "Other models of this provider: name -> context window (0 = unknown).")
    discover_window: bool = setting(True, "Ask the provider's metadata for unknown windows.")
    price_input_per_mtok: float = setting(0.0, "USD per million input tokens (0 = no cost).")
    price_output_per_mtok: float = setting(0.0, "USD per million output tokens.")
    timeout_seconds: float = setting(120.0, "Read timeout of one provider call.")
    idle_timeout_seconds: float = setting(
        120.0, "A reply with no content (only keep-alives) this long ends as `unavailable`.")
    max_line_bytes: int = setting(
        1024 * 1024, "Longest SSE/NDJSON line accepted; a longer one is a `protocol_error`.")
    max_connections: int = setting(1000, "Connections open to this provider at once (all kept alive).")
    pool_timeout_seconds: float = setting(
        1.0, "Wait this long for a free connection, then answer `overloaded`.")
    keepalive_expiry_seconds: float = setting(20.0, "Close a connection idle this long.")
    delay_ms: int = setting(25, "demo only: pause between streamed pieces.")
    tools: bool | list[str] = setting(
        True, "true = every [mcp_servers] server (a demo provider also gets the built-in lookup); "
        "false = none; or a list of server names and \"server/tool\" names.")
    num_ctx: int = setting(0, "ollama only: options.num_ctx sent with each call; 0 = server default.")
    count_endpoint: str = setting(
        "auto", "`auto`: between turns, ask the provider's count endpoint (vLLM or llama.cpp "
        "/tokenize, OpenAI /v1/responses/input_tokens, Anthropic /v1/messages/count_tokens) for the next "
        "request's exact count, once per provider remembering a 404; `off`: never.")

    @property
    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""


@dataclass(frozen=True)
class McpServerSettings:
    name: str  # the table's name, not a setting
    command: str = setting("", "stdio: the program to start (found on PATH); set command or url.")
    args: list[str] = setting([], "stdio: its arguments.")
    env: dict[str, str] = setting({}, "stdio: extra environment variables for the program.")
    cwd: str = setting("", "stdio: its working folder; empty = the server's.")
    url: str = setting("", "Streamable HTTP: the endpoint, e.g. http://127.0.0.1:3001/mcp.")
    headers_env: dict[str, str] = setting(
        {}, "Streamable HTTP: header name -> environment variable holding its value (secrets stay "
        "out of the file).")
    enabled: bool = setting(True, "false = not started, not offered.")
    start_timeout_seconds: float = setting(
        30.0, "Time to start (or reach) the server and list its tools; then it is retried with backoff.")
    call_timeout_seconds: float = setting(60.0, "A tool call answering later is an error to the model.")
    approve: str = setting("never", "never | always: ask the page before each call of this server's tools.")
    approve_tools: dict[str, str] = setting({}, "Tool name -> never | always, over `approve`.")
    max_tools: int = setting(128, "Tools offered from this server at most (the rest are left out, logged).")
    max_schema_bytes: int = setting(
        65536, "Bytes of tool schemas (name, description, input schema) offered from this server at most.")
    max_result_bytes: int = setting(
        4 * 1024 * 1024, "Largest message read from the server; a bigger result is dropped while read "
        "and answered as an error.")

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"

    def approval(self, tool: str) -> str:
        return self.approve_tools.get(tool, self.approve)


@dataclass(frozen=True)
class ModelRoute:
    hint: str = required("Name a classifier rule or /hint prefix refers to.")
    provider: str = required("Provider alias.")
    model: str = setting("", "Model; empty = the provider's model.")


@dataclass(frozen=True)
class ClassifierRule:
    hint: str = required("Hint chosen when the rule matches.")
    keywords: list[str] = setting([], "Case-insensitive substrings; any one matches.")
    patterns: list[str] = setting([], "Case-sensitive substrings; any one matches.")
    min_length: int = setting(0, "Minimum message length in UTF-8 bytes.")
    max_length: int = setting(0, "Maximum message length in bytes; 0 = none.")
    priority: int = setting(0, "Higher rules are tried first; ties keep file order.")


@dataclass(frozen=True)
class Settings:
    server: ServerSettings
    runtime: RuntimeSettings
    providers: dict[str, ProviderProfile]
    default_route: str
    model_routes: list[ModelRoute]
    classifier_rules: list[ClassifierRule]
    source: str = "embedded default"
    store: StoreSettings = field(default_factory=StoreSettings)
    live: LiveSettings = field(default_factory=LiveSettings)
    mcp_servers: dict[str, McpServerSettings] = field(default_factory=dict)
    auth: AuthSettings = field(default_factory=AuthSettings)

    @property
    def auth_mode(self) -> str:
        return self.auth.effective_mode(self.server.auth_token)


def _setting_type(hint: Any) -> type | tuple[type, ...]:
    """The type a TOML value must have: ``int | None`` reads as int, ``list[str]`` as list,
    ``bool | list[str]`` as either."""
    options = get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)
    kinds = tuple(get_origin(option) or option for option in options if option is not type(None))
    return kinds[0] if len(kinds) == 1 else kinds


def schema_of(cls: type) -> tuple[Setting, ...]:
    """The settings of one table, read from its dataclass (fields with help; required ones default
    to None)."""
    hints = get_type_hints(cls)
    return tuple(
        Setting(f.name, _setting_type(hints[f.name]), _default(f), f.metadata["help"])
        for f in fields(cls) if "help" in f.metadata)


def _default(f: Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None if f.default is MISSING else f.default


# section -> settings, derived from the dataclasses above (the one place defaults are written).
SCHEMA: dict[str, tuple[Setting, ...]] = {
    "server": schema_of(ServerSettings),
    "store": schema_of(StoreSettings),
    "live": schema_of(LiveSettings),
    "auth": schema_of(AuthSettings),
    "runtime": schema_of(RuntimeSettings),
    "runtime.history_pruning": schema_of(HistoryPruning),
    "runtime.compaction": schema_of(CompactionSettings),
}
PROVIDER_SCHEMA = schema_of(ProviderProfile)
MCP_SERVER_SCHEMA = schema_of(McpServerSettings)
ROUTE_SCHEMA = schema_of(ModelRoute)
RULE_SCHEMA = schema_of(ClassifierRule)
