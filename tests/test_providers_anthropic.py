from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import pytest

from server.config.settings import ProviderProfile
from server.errors import ContextOverflow, Overloaded, ProtocolError, RateLimited, Unavailable
from server.history.messages import ChatMessage, Image, ToolCall
from server.providers.anthropic import AnthropicProvider
from server.providers.base import (
    Finish,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from tests.fakes import Call, FakeAnthropic, Reply, drain, joined

pytestmark = pytest.mark.anyio

HELLO = ProviderRequest("claude-fake", [ChatMessage("system", "be brief"), ChatMessage("system", "be kind"),
                                        ChatMessage("user", "héllo")])


@pytest.fixture
async def provider(fake_anthropic: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    provider = AnthropicProvider(ProviderProfile("claude", "anthropic", base_url=fake_anthropic.base_url))
    yield provider
    await provider.aclose()


def _text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_anthropic_streams_text_and_one_usage_at_the_end(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake_anthropic.enqueue(Reply(text=["Hi ", "thére"], usage=(100, 7), cache=(20, 300), model="claude-x"))
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    assert joined(events) == [TextDelta("Hi thére"), Usage(420, 7), Finish("stop", "claude-x")]
    sent = fake_anthropic.requests[0]
    assert sent.path == "/v1/messages" and sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.json["system"] == "be brief\n\nbe kind"
    assert sent.json["max_tokens"] == 1024 and sent.json["stream"] is True
    assert sent.json["messages"] == [{"role": "user", "content": [{"type": "text", "text": "héllo"}]}]


async def test_anthropic_sends_api_key_from_environment(
    fake_anthropic: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant")
    fake_anthropic.api_key = "sk-ant"
    profile = ProviderProfile("claude", "anthropic", base_url=fake_anthropic.base_url,
                              api_key_env="FAKE_ANTHROPIC_KEY")
    provider = AnthropicProvider(profile)
    events, error = await drain(provider.stream(HELLO))
    await provider.aclose()
    assert error is None and _text(events) == "echo: héllo"


async def test_anthropic_thinking_and_fragmented_tool_use(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    calls = [Call("search", {"q": "ünï", "n": [1, 2]}, "toolu_1"), Call("clock", {}, "toolu_2")]
    reply = Reply(thinking=["hmm, ", "ok"], text=["Looking."], tool_calls=calls, usage=(10, 4))
    fake_anthropic.enqueue(reply)
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    assert events == [
        ThinkingDelta("hmm, "), ThinkingDelta("ok"), TextDelta("Looking."),
        ToolCallEvent("toolu_1", "search", {"q": "ünï", "n": [1, 2]}), ToolCallEvent("toolu_2", "clock", {}),
        Usage(10, 4), Finish("tool_calls", "claude-fake"),
    ]


async def test_anthropic_usage_absent_yields_no_usage(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake_anthropic.enqueue(Reply(text=["x"], usage=None, finish="max_tokens"))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and events == [TextDelta("x"), Finish("length", "claude-fake")]


async def test_anthropic_survives_awkward_chunk_splits(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    pieces = ["Grüße ", "🎉", "\r\n", "日本語"]
    for newline in ("\n", "\r\n", "\r"):
        fake_anthropic.split, fake_anthropic.newline = (1, 2, 3, 5, 7), newline
        fake_anthropic.enqueue(Reply(text=pieces, tool_calls=[Call("f", {"a": "ß"}, "t1")], usage=(3, 2)))
        events, error = await drain(provider.stream(HELLO))
        assert error is None, newline
        assert _text(events) == "".join(pieces)
        call = ToolCallEvent("t1", "f", {"a": "ß"})
        assert events[-3:] == [call, Usage(3, 2), Finish("tool_calls", "claude-fake")]


async def test_anthropic_ignores_unknown_events_and_reads_cumulative_usage(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    events_in = [
        ("message_start", '{"type":"message_start","message":{"model":"c","usage":{"input_tokens":5,'
                          '"output_tokens":1}}}'),
        ("brand_new_event", '{"type":"brand_new_event","whatever":1}'),
        ("content_block_start", '{"type":"content_block_start","index":0,"content_block":{"type":"text",'
                                '"text":"A"}}'),
        ("content_block_delta", '{"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
                                '"text":"B"}}'),
        ("content_block_stop", '{"type":"content_block_stop","index":0}'),
        ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"},'
                          '"usage":{"output_tokens":3}}'),
        ("message_delta", '{"type":"message_delta","delta":{},"usage":{"output_tokens":8}}'),
        ("message_stop", '{"type":"message_stop"}'),
    ]
    raw = "".join(f"event: {name}\ndata: {data}\n\n" for name, data in events_in).encode()
    fake_anthropic.enqueue(Reply(raw=raw))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and joined(events) == [TextDelta("AB"), Usage(5, 8), Finish("stop", "c")]


async def test_anthropic_translates_tools_images_and_merges_roles(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    png = Image("image/png", "iVBORw0KGgo=")
    messages = [
        ChatMessage("system", "sys"),
        ChatMessage("user", "[earlier turns omitted to fit the context window]", breadcrumb=True),
        ChatMessage("user", "look", images=[png]),
        ChatMessage("assistant", "Sure.",
                    tool_calls=[ToolCall("t1", "a", {"x": 1}), ToolCall("t2", "b", {})]),
        ChatMessage("tool", "one", tool_call_id="t1", name="a"),
        ChatMessage("tool", "two", tool_call_id="t2", name="b", images=[png]),
        ChatMessage("assistant", "old", left_out="pruned"),
    ]
    tools = [ToolSpec("a", "Tool A", {"type": "object"})]
    await drain(provider.stream(ProviderRequest("claude-fake", messages, tools, max_output_tokens=99)))
    body = fake_anthropic.requests[0].json
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    assert body["system"] == "sys" and body["max_tokens"] == 99
    assert body["tools"] == [{"name": "a", "description": "Tool A", "input_schema": {"type": "object"}}]
    assert body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "[earlier turns omitted to fit the context window]"},
            {"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Sure."},
            {"type": "tool_use", "id": "t1", "name": "a", "input": {"x": 1}},
            {"type": "tool_use", "id": "t2", "name": "b", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "one"}]},
            {"type": "tool_result", "tool_use_id": "t2",
             "content": [{"type": "text", "text": "two"}, image]}]},
    ]


async def test_anthropic_prompt_too_long_is_context_overflow(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake_anthropic.enqueue(FakeAnthropic.overflow(window=200000, requested=208656))
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, ContextOverflow)
    assert (error.requested_tokens, error.limit_tokens) == (208656, 200000)
    assert error.message.startswith("claude: HTTP 400: prompt is too long")


async def test_anthropic_rejected_request_names_the_field(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    _, error = await drain(provider.stream(ProviderRequest("claude-fake", [ChatMessage("system", "only")])))
    assert type(error) is ProtocolError and "roles must be user or assistant" in error.message


@pytest.mark.parametrize(
    ("error_type", "expected"),
    [("overloaded_error", Overloaded), ("api_error", Unavailable), ("rate_limit_error", RateLimited)],
)
async def test_anthropic_error_event_after_200(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider, error_type: str, expected: type
) -> None:
    fake_anthropic.enqueue(Reply(text=["partial"], stream_error="Overloaded", error_type=error_type))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "partial" and type(error) is expected
    assert error.message == "claude: HTTP 200, then an error event: Overloaded"


@pytest.mark.parametrize("ending", ["drop", "close"])
async def test_anthropic_stream_without_message_stop_is_unavailable(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider, ending: str
) -> None:
    fake_anthropic.enqueue(Reply(text=["half"], ending=ending))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "half" and type(error) is Unavailable and "ended early" in error.message


async def test_anthropic_has_no_window_discovery(provider: AnthropicProvider) -> None:
    assert await provider.context_window("claude-fake") is None


async def test_anthropic_held_stream_resumes_when_released(
    fake_anthropic: FakeAnthropic, provider: AnthropicProvider
) -> None:
    release = threading.Event()
    fake_anthropic.enqueue(Reply(text=["before ", "the hold"], hold=release, usage=(1, 2)))
    stream = provider.stream(HELLO)
    text = ""
    while text != "before the hold":  # in one piece or two, as the bytes arrived
        event = await anext(stream)
        assert isinstance(event, TextDelta) and (text + event.text) in "before the hold"
        text += event.text
    release.set()
    rest, error = await drain(stream)
    assert error is None and rest == [Usage(1, 2), Finish("stop", "claude-fake")]
