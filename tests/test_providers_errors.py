"""The error translation table (``providers/translate.py``), one table run against each dialect's fake:
the same HTTP failure becomes the same ``server.errors`` class whichever wire format carried it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server.config.settings import ProviderProfile
from server.errors import AuthError, ContextOverflow, Overloaded, ProtocolError, RateLimited, Unavailable
from server.history.messages import ChatMessage
from server.providers import build_provider
from server.providers.base import Provider, ProviderRequest
from tests.fakes import FakeProvider, Reply, drain

pytestmark = pytest.mark.anyio

DIALECTS = ["openai", "anthropic", "ollama"]
HELLO = ProviderRequest("m", [ChatMessage("user", "héllo")])

TABLE = [
    (401, "Incorrect API key", AuthError),
    (403, "forbidden", AuthError),
    (404, "The model `nope` does not exist", ProtocolError),
    (413, "Request exceeds the maximum allowed number of bytes", ProtocolError),
    (400, "messages: text content blocks must be non-empty", ProtocolError),
    (400, "max_tokens is too large: context length exceeded", ContextOverflow),
    (429, "slow down", RateLimited),
    (429, "too many tokens per minute for this context window", RateLimited),
    (500, "llama runner process has terminated", Unavailable),
    (503, "server busy, please try again", Overloaded),
    (529, "Overloaded", Overloaded),
]


@pytest.fixture(params=DIALECTS)
def fake(request: pytest.FixtureRequest) -> FakeProvider:
    return request.getfixturevalue(f"fake_{request.param}")


@pytest.fixture
async def provider(fake: FakeProvider) -> AsyncIterator[Provider]:
    provider = build_provider(ProviderProfile("local", fake.dialect, base_url=fake.base_url))
    yield provider
    await provider.aclose()


@pytest.mark.parametrize(("status", "message", "expected"), TABLE)
async def test_provider_http_error_is_translated(
    fake: FakeProvider, provider: Provider, status: int, message: str, expected: type
) -> None:
    fake.enqueue(Reply(status=status, error=message))
    events, error = await drain(provider.stream(HELLO))
    assert events == [] and type(error) is expected
    assert error.status == status and error.message == f"local: HTTP {status}: {message}"


async def test_provider_error_body_that_is_not_json_is_kept_as_text(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(status=502, body="<html>bad gateway</html>"))
    _, error = await drain(provider.stream(HELLO))
    assert type(error) is Unavailable and error.message == "local: HTTP 502: <html>bad gateway</html>"


@pytest.mark.parametrize(("headers", "seconds"), [({"retry-after": "12"}, 12.0), ({}, None),
                                                   ({"retry-after-ms": "1500"}, 1.5)])
async def test_provider_rate_limit_carries_retry_after(
    fake: FakeProvider, provider: Provider, headers: dict[str, str], seconds: float | None
) -> None:
    fake.enqueue(Reply(status=429, error="rate limited", headers=headers))
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, RateLimited) and error.retry_after == seconds and error.retryable
