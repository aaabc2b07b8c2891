from __future__ import annotations

import gzip
import socket
from collections.abc import AsyncIterator

import httpx
import pytest

from server.config.settings import ProviderProfile
from server.errors import (
    ContextOverflow,
    ProtocolError,
    Unavailable,
)
from server.history.messages import ChatMessage, Image, ToolCall
from server.providers.base import (
    Finish,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
    WindowInfo,
)
from server.providers.openai import OpenAIProvider
from tests.fakes import Call, FakeOpenAI, Reply, drain, joined

pytestmark = pytest.mark.anyio

HELLO = ProviderRequest("gpt-fake", [ChatMessage("system", "be brief"), ChatMessage("user", "héllo")])


@pytest.fixture
async def provider(fake_openai: FakeOpenAI) -> AsyncIterator[OpenAIProvider]:
    provider = OpenAIProvider(ProviderProfile("local", "openai", base_url=fake_openai.base_url))
    yield provider
    await provider.aclose()


def _text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_openai_streams_text_usage_and_finish(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake_openai.enqueue(Reply(text=["Hel", "lo ", "wörld"], usage=(42, 3), model="gpt-fake-0613"))
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    assert joined(events) == [TextDelta("Hello wörld"), Usage(42, 3),
                      Finish("stop", "gpt-fake-0613")]
    sent = fake_openai.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["stream"] is True and sent.json["stream_options"] == {"include_usage": True}
    assert sent.json["messages"] == [{"role": "system", "content": "be brief"},
                                     {"role": "user", "content": "héllo"}]


async def test_openai_sends_bearer_key_from_environment(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test")
    fake_openai.api_key = "sk-test"
    profile = ProviderProfile("keyed", "openai", base_url=fake_openai.base_url, api_key_env="FAKE_OPENAI_KEY")
    provider = OpenAIProvider(profile)
    events, error = await drain(provider.stream(HELLO))
    await provider.aclose()
    assert error is None and _text(events) == "echo: héllo"
    assert fake_openai.requests[0].headers["authorization"] == "Bearer sk-test"


async def test_openai_reasoning_fields_become_thinking(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    for field in ("reasoning_content", "reasoning"):
        fake_openai.reasoning_field = field
        fake_openai.enqueue(Reply(thinking=["let me ", "think"], text=["ok"]))
        events, error = await drain(provider.stream(HELLO))
        assert error is None
        assert [e for e in events if isinstance(e, ThinkingDelta)] == [ThinkingDelta("let me "),
                                                                        ThinkingDelta("think")], field


async def test_openai_joins_fragmented_tool_calls(fake_openai: FakeOpenAI, provider: OpenAIProvider) -> None:
    calls = [Call("search", {"query": "ünïcode", "limit": 5}, "call_a"), Call("clock", {})]
    fake_openai.enqueue(Reply(text=["looking"], tool_calls=calls))
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    assert [e for e in events if isinstance(e, ToolCallEvent)] == [
        ToolCallEvent("call_a", "search", {"query": "ünïcode", "limit": 5}),
        ToolCallEvent("call_fake_1", "clock", {}),
    ]
    assert events[-1] == Finish("tool_calls", "gpt-fake")


async def test_openai_usage_absent_yields_no_usage(fake_openai: FakeOpenAI, provider: OpenAIProvider) -> None:
    fake_openai.enqueue(Reply(text=["hi"], usage=None))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and events == [TextDelta("hi"), Finish("stop", "gpt-fake")]


async def test_openai_usage_with_null_choices(fake_openai: FakeOpenAI, provider: OpenAIProvider) -> None:
    raw = (b'data: {"model":"v","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}\n\n'
           b'data: {"model":"v","choices":null,"usage":{"prompt_tokens":9,"completion_tokens":1}}\n\n'
           b"data: [DONE]\n\n")
    fake_openai.enqueue(Reply(raw=raw))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and events == [TextDelta("x"), Usage(9, 1), Finish("length", "v")]


async def test_openai_survives_awkward_chunk_splits(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    pieces = ["Grüße ", "🎉 ", "日本語", "\r\n", "done"]
    for newline in ("\n", "\r\n", "\r"):
        fake_openai.split, fake_openai.newline = (1, 2, 3, 5, 7), newline
        fake_openai.enqueue(Reply(text=pieces, tool_calls=[Call("f", {"a": "ß"})], usage=(5, 6)))
        events, error = await drain(provider.stream(HELLO))
        assert error is None, newline
        assert _text(events) == "".join(pieces)
        assert ToolCallEvent("call_fake_0", "f", {"a": "ß"}) in events
        assert events[-2:] == [Usage(5, 6), Finish("tool_calls", "gpt-fake")]


async def test_openai_translates_history_tools_and_images(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    png = Image("image/png", "iVBORw0KGgo=")
    messages = [
        ChatMessage("user", "what is this?", images=[png]),
        ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "look", {"x": 1})]),
        ChatMessage("tool", "a cat", tool_call_id="c1", name="look", images=[png]),
        ChatMessage("user", "dropped earlier", left_out="trimmed"),
        ChatMessage("assistant", "A cat."),
    ]
    tools = [ToolSpec("look", "Look closer", {"type": "object", "properties": {}})]
    await drain(provider.stream(ProviderRequest("gpt-fake", messages, tools, max_output_tokens=64)))
    body = fake_openai.requests[0].json
    image_part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, image_part]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a cat"},
        {"role": "user", "content": [image_part]},
        {"role": "assistant", "content": "A cat."},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "look", "description": "Look closer", "parameters": {"type": "object", "properties": {}}}}]
    assert body["max_tokens"] == 64


async def test_openai_bad_tool_arguments_are_a_protocol_error(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    raw = (b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":'
           b'{"name":"f","arguments":"{\\"a\\": "}}]},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n')
    fake_openai.enqueue(Reply(raw=raw))
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, ProtocolError) and "not JSON" in error.message


@pytest.mark.parametrize(
    ("flavor", "status", "requested", "limit"),
    [("openai", 400, 9000, 8192), ("vllm_old", 400, 9000, 8192), ("vllm_new", 400, 9000, 8192),
     ("llamacpp", 400, 9000, 8192), ("llamacpp_500", 500, 9000, 8192), ("llamacpp_text", 400, 9000, 8192),
     ("vllm_max_tokens", 400, 7000, 8192)],
)
async def test_openai_overflow_of_each_server_is_context_overflow(
    fake_openai: FakeOpenAI, provider: OpenAIProvider, flavor: str, status: int, requested: int, limit: int
) -> None:
    fake_openai.enqueue(FakeOpenAI.overflow(flavor, window=limit, requested=requested))
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, ContextOverflow)
    assert (error.requested_tokens, error.limit_tokens, error.status) == (requested, limit, status)
    assert error.message.startswith(f"local: HTTP {status}: ")


async def test_llamacpp_overflow_fields_outrank_its_wording(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    error = {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096,
             "message": "request (1 tokens) exceeds the available context size (2 tokens), try increasing it"}
    fake_openai.enqueue(Reply(status=400, body={"error": error}))
    _, overflow = await drain(provider.stream(HELLO))
    assert isinstance(overflow, ContextOverflow)
    assert (overflow.requested_tokens, overflow.limit_tokens) == (5000, 4096)


async def test_openai_error_event_after_200_keeps_partial_text(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake_openai.enqueue(Reply(text=["partial "], stream_error="The server had an error"),
                        Reply(text=["partial "], stream_error="maximum context length is 4096 tokens",
                              error_type="invalid_request_error"))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "partial " and type(error) is Unavailable
    assert "HTTP 200" in error.message and error.message.startswith("local:")
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, ContextOverflow) and error.limit_tokens == 4096


@pytest.mark.parametrize("ending", ["drop", "close"])
async def test_openai_stream_without_done_is_unavailable(
    fake_openai: FakeOpenAI, provider: OpenAIProvider, ending: str
) -> None:
    fake_openai.enqueue(Reply(text=["half ", "a reply"], ending=ending))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "half a reply"
    assert type(error) is Unavailable and "ended early" in error.message and error.retryable


async def test_openai_connection_refused_is_unavailable() -> None:
    profile = ProviderProfile("gone", "openai", base_url=f"http://127.0.0.1:{_free_port()}/v1")
    provider = OpenAIProvider(profile)
    _, error = await drain(provider.stream(HELLO))
    await provider.aclose()
    assert type(error) is Unavailable and error.message.startswith("gone: cannot connect")


async def test_openai_read_timeout_is_unavailable(fake_openai: FakeOpenAI) -> None:
    profile = ProviderProfile("slow", "openai", base_url=fake_openai.base_url, timeout_seconds=0.2)
    fake_openai.enqueue(Reply(text=["a", "b"], delay=5.0))
    provider = OpenAIProvider(profile)
    events, error = await drain(provider.stream(HELLO))
    await provider.aclose()
    assert events == [] and type(error) is Unavailable and "timed out" in error.message


async def test_openai_window_from_model_cards(fake_openai: FakeOpenAI, provider: OpenAIProvider) -> None:
    fake_openai.models = {
        "vllm-model": {"max_model_len": 32768},
        "router/model": {"context_length": 200000},
        "router/nested": {"top_provider": {"context_length": 65536}},
        "gpt-plain": {},
    }
    expected = WindowInfo(32768, "provider", {"field": "max_model_len"})
    assert await provider.context_window("vllm-model") == expected
    assert (await provider.context_window("router/model")).tokens == 200000
    assert (await provider.context_window("router/nested")).tokens == 65536
    assert await provider.context_window("gpt-plain") is None
    assert await provider.context_window("absent") is None
    assert fake_openai.meta_requests[0].path == "/v1/models"


async def test_openai_window_discovery_never_raises(fake_openai: FakeOpenAI) -> None:
    for base_url in (f"http://127.0.0.1:{_free_port()}/v1", fake_openai.base_url + "/nothing"):
        provider = OpenAIProvider(ProviderProfile("x", "openai", base_url=base_url))
        assert await provider.context_window("m") is None
        await provider.aclose()


async def test_fake_openai_cuts_utf8_characters_across_chunks(fake_openai: FakeOpenAI) -> None:
    fake_openai.split = (1, 2, 3, 5, 7)
    fake_openai.enqueue(Reply(text=["日本語🎉"]))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", fake_openai.base_url + "/chat/completions", json=body) as response:
            chunks = [chunk async for chunk in response.aiter_bytes()]
    assert max(map(len, chunks)) <= 7
    undecodable = 0
    for chunk in chunks:
        try:
            chunk.decode("utf-8")
        except UnicodeDecodeError:
            undecodable += 1
    assert undecodable > 0
    assert "日本語🎉" in b"".join(chunks).decode("utf-8")


async def test_openai_consumer_can_stop_a_slow_stream(
    fake_openai: FakeOpenAI, provider: OpenAIProvider
) -> None:
    fake_openai.enqueue(Reply(text=["first ", "second ", "third"], delay=0.5))
    stream = provider.stream(HELLO)
    assert await anext(stream) == TextDelta("first ")
    await stream.aclose()  # what a "stop" does: the response is closed, no error escapes
    events, error = await drain(provider.stream(HELLO))
    assert error is None and _text(events) == "echo: héllo"


async def test_openai_reads_a_compressed_stream(fake_openai: FakeOpenAI, provider: OpenAIProvider) -> None:
    # Uncompressed streams skip httpx's decoder; a gzip one must still go through it.
    events = [b'data: {"choices":[{"delta":{"content":"zip"},"finish_reason":null}]}\n\n',
              b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]
    fake_openai.enqueue(Reply(raw=gzip.compress(b"".join(events)), headers={"content-encoding": "gzip"}))
    got, error = await drain(provider.stream(HELLO))
    assert error is None and got == [TextDelta("zip"), Finish("stop", None)]
