from __future__ import annotations

import threading
from collections.abc import AsyncIterator

import pytest

from server.config.settings import ProviderProfile
from server.errors import ContextOverflow, ProtocolError, Unavailable
from server.history.messages import ChatMessage, Image, ToolCall
from server.providers.base import (
    Finish,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCallEvent,
    ToolSpec,
    Usage,
)
from server.providers.ollama import OllamaProvider, _modelfile_num_ctx
from tests.fakes import Call, FakeOllama, Reply, drain, joined

pytestmark = pytest.mark.anyio

HELLO = ProviderRequest("llama-fake", [ChatMessage("user", "héllo")])


def _provider(fake: FakeOllama, num_ctx: int = 0) -> OllamaProvider:
    return OllamaProvider(ProviderProfile("local", "ollama", base_url=fake.base_url, num_ctx=num_ctx))


@pytest.fixture
async def provider(fake_ollama: FakeOllama) -> AsyncIterator[OllamaProvider]:
    provider = _provider(fake_ollama)
    yield provider
    await provider.aclose()


def _text(events: list[object]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


async def test_ollama_streams_thinking_text_usage_and_finish(
    fake_ollama: FakeOllama, provider: OllamaProvider
) -> None:
    fake_ollama.enqueue(Reply(thinking=["hm"], text=["Hel", "lö"], usage=(31, 2), model="llama-x"))
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    assert joined(events) == [ThinkingDelta("hm"), TextDelta("Hellö"), Usage(31, 2),
                      Finish("stop", "llama-x")]
    sent = fake_ollama.requests[0]
    assert sent.path == "/api/chat" and sent.json["stream"] is True
    assert "options" not in sent.json
    assert sent.json["messages"] == [{"role": "user", "content": "héllo"}]


async def test_ollama_sends_num_ctx_and_num_predict(fake_ollama: FakeOllama) -> None:
    provider = _provider(fake_ollama, num_ctx=16384)
    request = ProviderRequest("llama-fake", [ChatMessage("user", "x")], max_output_tokens=256)
    events, error = await drain(provider.stream(request))
    await provider.aclose()
    assert error is None and _text(events) == "echo: x"
    assert fake_ollama.requests[0].json["options"] == {"num_ctx": 16384, "num_predict": 256}


async def test_ollama_tool_calls_get_stable_distinct_ids(
    fake_ollama: FakeOllama, provider: OllamaProvider
) -> None:
    calls = [Call("search", {"q": "ü"}), Call("search", {"q": "ü"})]
    fake_ollama.enqueue(Reply(tool_calls=calls, usage=(9, 3)))
    events, error = await drain(provider.stream(HELLO))
    assert error is None
    tool_events = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [(e.name, e.arguments) for e in tool_events] == [("search", {"q": "ü"})] * 2
    assert all(e.id.startswith("call_") for e in tool_events)
    assert tool_events[0].id != tool_events[1].id
    assert events[-1] == Finish("tool_calls", "llama-fake")


async def test_ollama_tool_call_ids_repeat_for_the_same_reply(
    fake_ollama: FakeOllama, provider: OllamaProvider
) -> None:
    line = (b'{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":"",'
            b'"tool_calls":[{"function":{"name":"f","arguments":{"a":1}}}]},"done":false}\n'
            b'{"model":"m","created_at":"2025-01-01T00:00:00Z","message":{"role":"assistant","content":""},'
            b'"done":true,"done_reason":"stop"}\n')
    fake_ollama.enqueue(Reply(raw=line), Reply(raw=line))
    first, _ = await drain(provider.stream(HELLO))
    second, _ = await drain(provider.stream(HELLO))
    assert first[0] == second[0] and first[0].arguments == {"a": 1}


async def test_ollama_usage_absent_yields_no_usage(fake_ollama: FakeOllama, provider: OllamaProvider) -> None:
    fake_ollama.enqueue(Reply(text=["x"], usage=None, finish="length"))
    events, error = await drain(provider.stream(HELLO))
    assert error is None and events == [TextDelta("x"), Finish("length", "llama-fake")]


async def test_ollama_survives_awkward_chunk_splits(
    fake_ollama: FakeOllama, provider: OllamaProvider
) -> None:
    pieces = ["Grüße ", "🎉", "\n", "日本語"]
    for newline in ("\n", "\r\n"):
        fake_ollama.split, fake_ollama.newline = (1, 2, 3, 5, 7), newline
        fake_ollama.enqueue(Reply(text=pieces, usage=(4, 4)))
        events, error = await drain(provider.stream(HELLO))
        assert error is None, newline
        assert _text(events) == "".join(pieces)
        assert events[-2:] == [Usage(4, 4), Finish("stop", "llama-fake")]


async def test_ollama_translates_tools_and_images(fake_ollama: FakeOllama, provider: OllamaProvider) -> None:
    png = Image("image/png", "iVBORw0KGgo=")
    messages = [
        ChatMessage("system", "sys"),
        ChatMessage("user", "look", images=[png]),
        ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "zoom", {"level": 2})]),
        ChatMessage("tool", "zoomed", tool_call_id="c1", name="zoom"),
        ChatMessage("user", "gone", left_out="trimmed"),
    ]
    tools = [ToolSpec("zoom", "Zoom in", {"type": "object"})]
    await drain(provider.stream(ProviderRequest("llama-fake", messages, tools)))
    body = fake_ollama.requests[0].json
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "look", "images": ["iVBORw0KGgo="]},
        {"role": "assistant", "content": "",
         "tool_calls": [{"function": {"name": "zoom", "arguments": {"level": 2}}}]},
        {"role": "tool", "content": "zoomed", "tool_name": "zoom"},
    ]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "zoom", "description": "Zoom in", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    "message",
    ["the input length exceeds the context length",
     "input length (5000 tokens) exceeds the context length (4096 tokens)",
     "prompt has too many tokens for the context window"],
)
async def test_ollama_overflow_texts_are_context_overflow(
    fake_ollama: FakeOllama, provider: OllamaProvider, message: str
) -> None:
    fake_ollama.enqueue(FakeOllama.overflow(message))
    _, error = await drain(provider.stream(HELLO))
    assert isinstance(error, ContextOverflow) and error.message == f"local: HTTP 400: {message}"


async def test_ollama_error_line_after_200(fake_ollama: FakeOllama, provider: OllamaProvider) -> None:
    fake_ollama.enqueue(Reply(text=["part"], stream_error="llama runner process has terminated"),
                        Reply(text=["part"], stream_error="the input length exceeds the context length"))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "part" and type(error) is Unavailable and "HTTP 200" in error.message
    _, error = await drain(provider.stream(HELLO))
    assert type(error) is ContextOverflow


async def test_ollama_bad_line_is_a_protocol_error(fake_ollama: FakeOllama, provider: OllamaProvider) -> None:
    fake_ollama.enqueue(Reply(raw=b'{"message":{"content":"a"},"done":false}\nnot json\n'))
    events, error = await drain(provider.stream(HELLO))
    assert events == [TextDelta("a")] and type(error) is ProtocolError


@pytest.mark.parametrize("ending", ["drop", "close"])
async def test_ollama_stream_without_done_is_unavailable(
    fake_ollama: FakeOllama, provider: OllamaProvider, ending: str
) -> None:
    fake_ollama.enqueue(Reply(text=["half"], ending=ending))
    events, error = await drain(provider.stream(HELLO))
    assert _text(events) == "half" and type(error) is Unavailable and "ended early" in error.message


async def test_ollama_window_prefers_the_effective_num_ctx(fake_ollama: FakeOllama) -> None:
    fake_ollama.models = {"tuned": {"context_length": 131072, "num_ctx": 8192, "arch": "qwen2"},
                          "plain": {"context_length": 131072}, "tiny": {"context_length": 2048}}
    provider = _provider(fake_ollama)
    tuned = await provider.context_window("tuned")
    plain = await provider.context_window("plain")
    tiny = await provider.context_window("tiny")
    missing = await provider.context_window("absent")
    await provider.aclose()
    assert (tuned.tokens, tuned.detail["trained"]) == (8192, 131072)
    assert tuned.detail["basis"] == "modelfile num_ctx"
    assert (plain.tokens, plain.detail["basis"]) == (4096, "assumed server default")
    assert tiny.tokens == 2048 and missing is None
    assert fake_ollama.meta_requests[0].json == {"model": "tuned"}
    configured = _provider(fake_ollama, num_ctx=32768)
    window = await configured.context_window("tuned")
    await configured.aclose()
    assert (window.tokens, window.detail["basis"]) == (32768, "profile num_ctx")


def test_modelfile_num_ctx_reads_a_megabyte_of_blank_lines_in_linear_time() -> None:
    # The pattern once began with \s*, which at every line start ran over all the newlines after it.
    parameters = "\n" * (1 << 20) + "num_ctx 8192\r\n"
    found: list[int | None] = []
    worker = threading.Thread(target=lambda: found.append(_modelfile_num_ctx(parameters)), daemon=True)
    worker.start()
    worker.join(30)  # generous: linear takes milliseconds, quadratic hours
    assert found == [8192]
