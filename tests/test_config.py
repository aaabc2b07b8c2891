from __future__ import annotations

import pytest

from server.config.demo import DEMO_PROFILE
from server.config.load import load_settings, settings_from_mapping
from server.errors import ConfigError


def test_config_without_file_is_the_embedded_demo():
    settings = load_settings(env={})
    assert settings.providers == {"demo": DEMO_PROFILE}
    assert settings.default_route == "demo" and settings.source == "embedded default"
    assert settings.runtime.max_context_tokens is None and settings.runtime.turn_limit == 50


@pytest.mark.parametrize("data, key", [
    ({"runtime": {"max_context_tokenz": 1}}, "runtime.max_context_tokenz: unknown setting"),
    ({"runtime": {"max_context_tokens": "big"}}, "runtime.max_context_tokens: expected int"),
    ({"runtime": {"max_context_tokens": True}}, "runtime.max_context_tokens: expected an integer"),
    ({"server": {"port": 1.5}}, "server.port: expected int"),
    ({"providers": {"x": {"kind": "grpc"}}}, "providers.x.kind: expected one of"),
    ({"providers": {"x": {"kind": "openai"}}}, "providers.x.base_url: required"),
    ({"providers": {"x": {"kind": "demo", "colour": 1}}}, "providers.x.colour: unknown setting"),
    ({"providers": {"x": {"kind": "demo", "models": {"m": "big"}}}}, "providers.x.models.m: expected int"),
    ({"default_route": "nowhere/m"}, "default_route: names provider 'nowhere'"),
    ({"model_routes": [{"hint": "h", "provider": "ghost"}]},
     "model_routes[0].provider: names provider 'ghost'"),
    ({"model_routes": [{"provider": "demo"}]}, "model_routes[0].hint: required"),
    ({"classifier": {"rules": [{"hint": "h", "keywords": "x"}]}},
     "classifier.rules[0].keywords: expected list"),
    ({"classifier": {"mode": "x"}}, "classifier.mode: unknown setting"),
    ({"runtime": {"compaction": {"strategy": "magic"}}}, "runtime.compaction.strategy: expected one of"),
    ({"surprise": 1}, "surprise: unknown setting"),
])
def test_config_errors_name_the_key(data, key):
    with pytest.raises(ConfigError) as info:
        settings_from_mapping(data, env={})
    assert key in str(info.value)


def test_config_environment_overrides_file_values():
    env = {"METERCHAT_RUNTIME_MAX_CONTEXT_TOKENS": "0", "METERCHAT_SERVER_PORT": "9001",
           "METERCHAT_RUNTIME_HISTORY_PRUNING_ENABLED": "yes", "METERCHAT_DATA_DIR": "elsewhere",
           "METERCHAT_SERVER_ALLOWED_ORIGINS": "http://a, http://b"}
    settings = settings_from_mapping({"runtime": {"max_context_tokens": 9000}}, env=env)
    assert settings.runtime.max_context_tokens == 0
    assert settings.server.port == 9001 and settings.server.data_dir == "elsewhere"
    assert settings.runtime.history_pruning.enabled is True
    assert settings.server.allowed_origins == ["http://a", "http://b"]


def test_config_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="METERCHAT_SERVER_PORT"):
        settings_from_mapping({}, env={"METERCHAT_SERVER_PORT": "eighty"})


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('default_route = "local/llama3"\n[providers.local]\nkind = "ollama"\n'
                    'base_url = "http://127.0.0.1:11434"\nmodel = "llama3"\ncontext_window = 8192\n'
                    '[[model_routes]]\nhint = "fast"\nprovider = "local"\nmodel = "tiny"\n')
    settings = load_settings(path, env={})
    assert settings.default_route == "local/llama3" and settings.source == str(path)
    assert settings.providers["local"].context_window == 8192
    assert settings.model_routes[0].model == "tiny"


def test_config_api_key_comes_from_the_named_variable(monkeypatch):
    settings = settings_from_mapping({"providers": {"o": {"kind": "openai", "base_url": "http://x/v1",
                                                          "api_key_env": "MY_KEY"}}}, env={})
    monkeypatch.setenv("MY_KEY", "k-123")
    assert settings.providers["o"].api_key == "k-123"


def test_config_missing_or_broken_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "none.toml", env={})
    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n")
    with pytest.raises(ConfigError, match="broken.toml"):
        load_settings(broken, env={})


def test_config_defaults_are_the_dataclass_defaults():
    from server.config.settings import PROVIDER_SCHEMA, ProviderProfile, RuntimeSettings, ServerSettings

    settings = settings_from_mapping({}, env={})
    assert settings.server == ServerSettings() and settings.runtime == RuntimeSettings()
    profile = ProviderProfile("x", "demo")
    assert {s.name: s.default for s in PROVIDER_SCHEMA if s.name != "kind"} == \
        {name: getattr(profile, name) for name in (s.name for s in PROVIDER_SCHEMA) if name != "kind"}


@pytest.mark.parametrize("target", [0, -5, 1001])
def test_compaction_target_outside_trigger_is_refused(target: int) -> None:
    data = {"runtime": {"compaction": {"strategy": "truncation", "tokens_exceed": 1000,
                                       "target_tokens": target}}}
    with pytest.raises(ConfigError, match="target_tokens"):
        settings_from_mapping(data, env={})


def test_compaction_target_equal_to_trigger_is_honoured() -> None:
    data = {"runtime": {"compaction": {"strategy": "truncation", "tokens_exceed": 1000,
                                       "target_tokens": 1000}}}
    assert settings_from_mapping(data, env={}).runtime.compaction.target_tokens == 1000


@pytest.mark.parametrize("key", ["max_reply_chars", "max_tool_argument_chars"])
def test_config_a_zero_reply_bound_is_refused_naming_the_key(key: str) -> None:
    """0 would end every reply at its first character: refused, not read as "no bound"."""
    with pytest.raises(ConfigError, match=f"runtime.{key}: must be greater than 0"):
        settings_from_mapping({"runtime": {key: 0}}, env={})
