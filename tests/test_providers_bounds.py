"""What a provider cannot do to the server, each dialect against its real fake: stall it with
keep-alives, grow it with an endless line, event, error body or metadata answer, poison a session with
half an emoji, make it show a key, or queue it behind a full connection pool."""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from server.config.settings import ProviderProfile
from server.errors import AuthError, Overloaded, ProtocolError, Unavailable
from server.history.messages import ChatMessage
from server.providers import build_provider
from server.providers._http import get_json
from server.providers.base import Finish, Provider, ProviderRequest, TextDelta, ThinkingDelta
from tests.fakes import ENDLESS, FakeProvider, Reply, drain

pytestmark = pytest.mark.anyio

HELLO = ProviderRequest("m", [ChatMessage("user", "héllo")])
KEY = "sk-live-4f9aQ27xZk81bLm0PqRs"
PASSWORD = "hunter2-pw"


@pytest.fixture(params=["openai", "anthropic", "ollama"])
def fake(request: pytest.FixtureRequest) -> FakeProvider:
    return request.getfixturevalue(f"fake_{request.param}")


def profile(fake: FakeProvider, **settings: Any) -> ProviderProfile:
    return ProviderProfile("local", fake.dialect, base_url=fake.base_url, **settings)


@pytest.fixture
async def provider(fake: FakeProvider) -> AsyncIterator[Provider]:
    provider = build_provider(profile(fake, idle_timeout_seconds=0.3, max_line_bytes=4096))
    yield provider
    await provider.aclose()


def _text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_provider_sending_only_keepalives_ends_unavailable(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(text=["hi"], ending="close", keepalive=0.02))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "hi"
    assert type(error) is Unavailable and "no content for 0.3 s" in error.message and error.retryable


async def test_provider_slow_but_steady_reply_is_not_idle(fake: FakeProvider, provider: Provider) -> None:
    fake.enqueue(Reply(text=list("abcdefgh"), delay=0.05))  # 0.35 s in all: longer than the idle limit
    events, error = await drain(provider.stream(HELLO))
    assert error is None and _text(events) == "abcdefgh"


async def test_provider_line_over_the_limit_is_a_protocol_error(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(text=["ok", "x" * 5000]))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "ok"
    assert type(error) is ProtocolError and "longer than 4096 bytes" in error.message


async def test_provider_line_at_the_limit_is_read(fake: FakeProvider, provider: Provider) -> None:
    fake.enqueue(Reply(text=["y" * 3000]))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and _text(events) == "y" * 3000


async def test_provider_huge_error_body_is_read_to_64_kib(fake: FakeProvider, provider: Provider) -> None:
    fake.enqueue(Reply(status=500, error="boom " * 100, error_size=200 * 1024 * 1024))
    events, error = await drain(provider.stream(HELLO))
    assert events == [] and type(error) is Unavailable
    assert error.message.startswith("local: HTTP 500: boom boom") and len(error.message) <= 300
    # The fake stops once the socket buffers are full: far below the 200 MB it offered.
    assert fake.error_bytes_sent < 32 * 1024 * 1024, fake.error_bytes_sent


async def test_provider_emoji_split_across_two_deltas_arrives_whole(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(thinking=["hm \ud83e", "\udd14"], text=["hi \ud83d", "\ude00 there"]))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and _text(events) == "hi 😀 there"
    assert "".join(e.text for e in events if isinstance(e, ThinkingDelta)) == "hm 🤔"
    for event in events:
        if isinstance(event, TextDelta | ThinkingDelta):
            event.text.encode("utf-8")  # strict: raises on any surrogate left


async def test_provider_lone_surrogates_become_replacement_characters(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(text=["a\udc00b", "c\ud800"]))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and _text(events) == "a\ufffdbc\ufffd" and isinstance(events[-1], Finish)


async def test_provider_error_never_shows_a_key(
    fake: FakeProvider, caplog: pytest.LogCaptureFixture
) -> None:
    host = fake.base_url.split("://", 1)[1]
    keyed = build_provider(ProviderProfile("local", fake.dialect, base_url=f"http://admin:{PASSWORD}@{host}"))
    echoed = (f"Incorrect API key provided: {KEY}. Authorization: Bearer {KEY} at "
              f"http://admin:{PASSWORD}@internal.example/v1 " + "details " * 200)
    fake.enqueue(Reply(status=401, error=echoed))
    with caplog.at_level(logging.DEBUG, logger="server.providers"):
        _, error = await drain(keyed.stream(HELLO))
    await keyed.aclose()
    assert isinstance(error, AuthError)
    assert error.message.startswith("local: HTTP 401: Incorrect API key provided: sk-")
    assert len(error.message) <= 300
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "details details" in logged  # the whole body is in the debug log ...
    for secret in (KEY, PASSWORD, KEY[8:]):
        assert secret not in error.message and secret not in logged  # ... but no secret anywhere
        assert secret not in str(error.args)


async def test_provider_transport_error_hides_base_url_credentials(fake: FakeProvider) -> None:
    keyed = build_provider(ProviderProfile("gone", fake.dialect, base_url=f"http://u:{PASSWORD}@127.0.0.1:9/x"))
    _, error = await drain(keyed.stream(HELLO))
    await keyed.aclose()
    assert type(error) is Unavailable and "cannot connect" in error.message
    assert PASSWORD not in error.message


async def test_provider_pool_full_is_overloaded_at_once(fake: FakeProvider) -> None:
    narrow = build_provider(profile(fake, max_connections=1, pool_timeout_seconds=0.2))
    hold = threading.Event()
    fake.enqueue(Reply(text=["first"], hold=hold))
    first = narrow.stream(HELLO)
    try:
        assert await anext(first) == TextDelta("first")  # holds the only connection
        _, error = await drain(narrow.stream(HELLO))
        assert type(error) is Overloaded and error.retryable and "max_connections" in error.message
    finally:
        hold.set()
    rest, error = await drain(first)
    await narrow.aclose()
    assert error is None and isinstance(rest[-1], Finish)


@pytest.mark.parametrize("fill", [b"x", b"0123456789abcdef", b"<p>a proxy's page</p>\n"])
async def test_provider_error_body_that_never_ends_is_answered_from_its_head(
    fake: FakeProvider, provider: Provider, fill: bytes
) -> None:
    fake.enqueue(Reply(status=500, error="boom", error_size=ENDLESS, error_fill=fill))
    with anyio.fail_after(5):  # generous: the answer takes milliseconds; before the fix, minutes
        events, error = await drain(provider.stream(HELLO))
    assert events == [] and type(error) is Unavailable and len(error.message) <= 300
    assert error.message.startswith("local: HTTP 500: ") and error.message.endswith("[cut after 64 KiB]")


async def test_provider_error_body_dripping_is_judged_on_what_came_in_a_second(
    fake: FakeProvider, provider: Provider
) -> None:
    fake.enqueue(Reply(status=503, body="slow ", error_size=ENDLESS, error_fill=b"."))
    fake.drip = 0.2  # seconds between the body's pieces
    events, error = await drain(provider.stream(HELLO))
    assert type(error) is Overloaded and error.message.startswith("local: HTTP 503: slow")
    assert "[cut after 0 KiB]" in error.message


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])  # NDJSON's values are one line each
async def test_sse_event_of_endless_data_lines_is_a_protocol_error(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    fake: FakeProvider = request.getfixturevalue(f"fake_{dialect}")
    provider = build_provider(profile(fake, max_line_bytes=4096))
    fake.enqueue(Reply(raw=b"data: {\n" + b"data: \"x\": 1,\n" * 10_000))
    _, error = await drain(provider.stream(HELLO))
    await provider.aclose()
    assert type(error) is ProtocolError and "an event longer than 4096 bytes" in error.message


@pytest.mark.parametrize("dialect", ["openai", "ollama"])  # the dialects that discover windows
@pytest.mark.parametrize("size", [ENDLESS, 64 << 20], ids=["endless", "64-MB"])
async def test_window_discovery_reads_a_bounded_metadata_body(
    request: pytest.FixtureRequest, dialect: str, size: int
) -> None:
    fake: FakeProvider = request.getfixturevalue(f"fake_{dialect}")
    fake.models = {"m": {"max_model_len": 8192, "context_length": 8192}}
    fake.meta_flood = (b'{"data": [', b'{"id": "other", "max_model_len": 1},', size)
    provider = build_provider(profile(fake))
    with anyio.fail_after(10):
        assert await provider.context_window("m") is None
    await provider.aclose()
    assert fake.error_bytes_sent < 32 << 20, fake.error_bytes_sent


async def test_metadata_call_that_drips_is_cut_at_its_time_bound(fake_openai: FakeProvider) -> None:
    fake_openai.meta_flood = (b'{"data": [', b" ", ENDLESS)
    fake_openai.drip = 0.05
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(5):
            got = await get_json(http, "GET", fake_openai.base_url + "/models", headers={}, seconds=0.3)
    assert got is None
