"""What the three HTTP dialects share (``providers/_http.HttpProvider``)."""

from __future__ import annotations

import pytest

from server.config.load import settings_from_mapping
from server.config.settings import ProviderProfile
from server.errors import ConfigError
from server.history.messages import ChatMessage
from server.providers import build_provider
from server.providers._http import build_client
from server.providers.base import Finish, ProviderRequest
from tests.fakes import drain

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("kind", ["openai", "anthropic", "ollama"])
async def test_http_provider_reuses_its_connection_across_calls(kind, request):
    fake = request.getfixturevalue(f"fake_{kind}")
    provider = build_provider(ProviderProfile(alias=kind, kind=kind, base_url=fake.base_url, model="m"))
    call = ProviderRequest("m", [ChatMessage("user", "hello")])
    try:
        for _ in range(3):
            events, error = await drain(provider.stream(call))
            assert error is None and isinstance(events[-1], Finish)
    finally:
        await provider.aclose()
    ports = {recorded.peer for recorded in fake.requests}
    assert len(fake.requests) == 3 and len(ports) == 1


@pytest.mark.parametrize("key", ["idle_timeout_seconds", "max_line_bytes", "max_connections",
                                 "pool_timeout_seconds"])
def test_provider_limit_of_zero_stops_start_up_naming_the_key(key):
    table = {"providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", key: 0}}}
    with pytest.raises(ConfigError, match=rf"providers\.p\.{key}: must be greater than 0"):
        settings_from_mapping(table, env={})


def test_provider_limits_reach_the_http_client():
    profile = ProviderProfile(alias="p", kind="openai", base_url="http://127.0.0.1:9/v1",
                              max_connections=7, pool_timeout_seconds=0.5, keepalive_expiry_seconds=3.0,
                              idle_timeout_seconds=9.0)
    client = build_client(profile)
    pool = client._transport._pool  # the only way to read httpx's limits back; no public accessor
    assert (pool._max_connections, pool._max_keepalive_connections, pool._keepalive_expiry) == (7, 7, 3.0)
    assert (client.timeout.pool, client.timeout.read) == (0.5, 9.0)
