"""What the three HTTP dialects share (``providers/_http.HttpProvider``)."""

from __future__ import annotations

import pytest

from server.config import ProviderProfile
from server.history import ChatMessage
from server.providers import build_provider
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
