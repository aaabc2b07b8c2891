"""The reply bound at its edge, each dialect against its real fake: a reply of exactly
``ReplyLimits.chars`` characters (text and thinking together) arrives whole, one more ends the call
with ``ReplyTooLarge`` after what fit; one tool call's arguments past ``tool_argument_chars`` end it
too, also in Ollama, whose calls come whole on one line. The endless streams are in
``test_providers_endless.py``, through the whole server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from server.config.settings import ProviderProfile
from server.errors import ReplyTooLarge
from server.history.messages import ChatMessage
from server.providers import build_provider
from server.providers.base import (
    Provider,
    ProviderRequest,
    ReplyLimits,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
)
from server.providers.budget import CALL_COST
from tests.fakes import Call, FakeProvider, Reply, drain

pytestmark = pytest.mark.anyio

LIMITS = ReplyLimits(chars=1000, tool_argument_chars=400)
ASK = ProviderRequest("m", [ChatMessage("user", "hi")], limits=LIMITS)


@pytest.fixture(params=["openai", "anthropic", "ollama"])
def fake(request: pytest.FixtureRequest) -> FakeProvider:
    return request.getfixturevalue(f"fake_{request.param}")


@pytest.fixture
async def provider(fake: FakeProvider) -> AsyncIterator[Provider]:
    provider = build_provider(ProviderProfile("local", fake.dialect, base_url=fake.base_url))
    yield provider
    await provider.aclose()


def room(fake: FakeProvider, blocks: int) -> int:
    """Characters of text the reply may hold: Anthropic's content blocks each cost CALL_COST."""
    return LIMITS.chars - (blocks * CALL_COST if fake.dialect == "anthropic" else 0)


def chars(events: list[object]) -> int:
    return sum(len(e.text) for e in events if isinstance(e, TextDelta | ThinkingDelta))


async def test_a_reply_of_exactly_the_bound_arrives_whole(fake: FakeProvider, provider: Provider) -> None:
    text = room(fake, blocks=2) - 200
    fake.enqueue(Reply(thinking=["t" * 200], text=["x" * (text - text // 2), "x" * (text // 2)]))
    events, error = await drain(provider.stream(ASK))
    assert error is None and chars(events) == room(fake, blocks=2)


async def test_one_character_more_ends_the_call_after_what_fit(fake: FakeProvider,
                                                               provider: Provider) -> None:
    text = room(fake, blocks=2) - 200
    fake.enqueue(Reply(thinking=["t" * 200], text=["x" * (text - text // 2), "x" * (text // 2), "!"]))
    events, error = await drain(provider.stream(ASK))
    assert type(error) is ReplyTooLarge and error.code == "reply_too_large"
    assert "1,000 characters (runtime.max_reply_chars)" in error.message
    assert chars(events) == room(fake, blocks=2)  # everything before the delta that crossed the bound


async def test_one_tool_call_past_its_argument_bound_ends_the_call(fake: FakeProvider,
                                                                   provider: Provider) -> None:
    fake.enqueue(Reply(tool_calls=[Call("search", {"q": "y" * 500})]))
    events, error = await drain(provider.stream(ASK))
    assert type(error) is ReplyTooLarge and "tool call 'search'" in error.message
    assert "runtime.max_tool_argument_chars" in error.message
    assert not [e for e in events if isinstance(e, ToolCallEvent)]


async def test_a_tool_call_within_its_bound_is_yielded(fake: FakeProvider, provider: Provider) -> None:
    fake.enqueue(Reply(tool_calls=[Call("search", {"q": "y" * 300})]))
    events, error = await drain(provider.stream(ASK))
    assert error is None
    assert [e.arguments for e in events if isinstance(e, ToolCallEvent)] == [{"q": "y" * 300}]


async def test_many_calls_count_against_the_reply(fake: FakeProvider, provider: Provider) -> None:
    """Each call costs its bookkeeping (CALL_COST), so a reply of many small calls is bounded."""
    fake.enqueue(Reply(tool_calls=[Call(f"f{n}", {}) for n in range(5)]))
    events, error = await drain(provider.stream(ASK))
    assert type(error) is ReplyTooLarge and "max_reply_chars" in error.message
