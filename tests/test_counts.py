"""Count endpoints (issue 20): each provider's own count of a whole request, from its real fake
(vLLM and llama.cpp ``/tokenize``, OpenAI ``/v1/responses/input_tokens``, Anthropic
``/v1/messages/count_tokens``), and the meter on it between turns, never in a send's way."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from server.config.settings import ProviderProfile
from server.history.messages import ChatMessage, ToolCall
from server.providers import build_provider
from server.providers.base import ProviderRequest, TokenCount
from server.tools.demo import tool_specs
from tests.fakes import FakeProvider, Reply
from tests.support import Client, client, serve, settings_for

pytestmark = pytest.mark.anyio

CALL = ToolCall("call_1", "lookup_document", {"title": "paper moon"})
REQUEST = ProviderRequest("m", [ChatMessage("system", "Be brief."), ChatMessage("user", "find paper moon"),
                                ChatMessage("assistant", "", tool_calls=[CALL]),
                                ChatMessage("tool", "Every night a moon", tool_call_id="call_1",
                                            name="lookup_document"),
                                ChatMessage("user", "and then?")], tool_specs(), 512)
OPENAI_STYLE = {"vllm": ["/tokenize"], "llamacpp": ["/tokenize", "/apply-template", "/tokenize", "/props"],
                "openai": ["/tokenize", "/v1/responses/input_tokens"]}


def fake_for(request: pytest.FixtureRequest, counter: str) -> FakeProvider:
    name = "fake_anthropic" if counter == "anthropic" else "fake_openai"
    fake: FakeProvider = request.getfixturevalue(name)
    fake.counter = counter
    fake.count_window = 32768
    return fake


async def count(fake: FakeProvider, **settings: Any) -> TokenCount | None:
    provider = build_provider(ProviderProfile("p", fake.dialect, base_url=fake.base_url, **settings))
    try:
        return await provider.count_tokens(REQUEST)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("counter", ["vllm", "llamacpp", "openai"])
async def test_openai_style_server_is_probed_for_its_count_endpoint(
    request: pytest.FixtureRequest, counter: str
) -> None:
    fake = fake_for(request, counter)
    got = await count(fake)
    assert [r.path for r in fake.count_requests] == OPENAI_STYLE[counter]
    last = fake.count_requests[-1 if counter != "llamacpp" else -2].json
    if counter == "vllm":  # chat messages and tools in one call; the answer has the window too
        body = fake.count_requests[0].json
        assert body["add_generation_prompt"] is True and len(body["tools"]) == len(tool_specs())
        assert got == TokenCount(fake.count_of({"messages": body["messages"], "tools": body["tools"]}),
                                 "vllm /tokenize", 32768)
    elif counter == "llamacpp":  # the templated prompt is what is counted; n_ctx from /props
        assert "content" in last and got is not None and got.window == 32768
        assert got.tokens == fake.count_of(last["content"])
    else:  # Responses input items: messages, the function call and its output
        kinds = [item.get("type", item.get("role")) for item in last["input"]]
        assert kinds == ["system", "user", "function_call", "function_call_output", "user"]
        spec = tool_specs()[0]
        assert last["tools"][0] == {"type": "function", "name": spec.name, "description": spec.description,
                                    "parameters": spec.parameters}
        assert got == TokenCount(fake.count_of({"input": last["input"], "tools": last["tools"]}),
                                 "openai /v1/responses/input_tokens")


async def test_anthropic_counts_the_prompt_fields_only(request: pytest.FixtureRequest) -> None:
    fake = fake_for(request, "anthropic")
    got = await count(fake)
    (call,) = fake.count_requests
    assert call.path == "/v1/messages/count_tokens" and "max_tokens" not in call.json
    assert call.json["system"] == "Be brief." and len(call.json["tools"]) == len(tool_specs())
    assert got is not None and got.tokens == fake.count_of({k: call.json.get(k) for k in
                                                             ("system", "messages", "tools")})


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_a_provider_without_count_endpoints_is_asked_once(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    fake: FakeProvider = request.getfixturevalue(f"fake_{dialect}")
    provider = build_provider(ProviderProfile("p", dialect, base_url=fake.base_url))
    assert await provider.count_tokens(REQUEST) is None
    asked = len(fake.count_requests)
    assert asked == (2 if dialect == "openai" else 1)  # every endpoint answered 404 ...
    assert await provider.count_tokens(REQUEST) is None
    assert len(fake.count_requests) == asked  # ... and that is remembered
    await provider.aclose()


async def test_count_endpoint_off_never_asks(request: pytest.FixtureRequest) -> None:
    fake = fake_for(request, "vllm")
    assert await count(fake, count_endpoint="off") is None and fake.count_requests == []


def settings(tmp_path: Any, fake: FakeProvider, **extra: Any) -> Any:
    profile = {"kind": fake.dialect, "base_url": fake.base_url, "model": "m", "context_window": 32768,
               "discover_window": False, **extra}
    return settings_for(tmp_path, {"providers": {"p": profile}})


async def counted_frame(c: Client) -> dict[str, Any]:
    while True:
        frame = await c.recv(timeout=10)
        if frame["type"] == "context" and frame["reason"] == "count":
            return frame


async def test_meter_shows_the_count_between_turns_and_the_next_send_builds_on_it(
    tmp_path: Any, fake_openai: FakeProvider
) -> None:
    fake_openai.counter = "vllm"
    with serve(settings(tmp_path, fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            opened = await counted_frame(c)  # the system prompt and the tool schemas, counted
            await c.say("hello there")
            after = await counted_frame(c)
            frames = await c.say("and again")
    counts = [r.json for r in fake_openai.count_requests]
    assert opened["tokens_source"] == after["tokens_source"] == "provider_count"
    assert opened["estimated_tokens"] == fake_openai.count_of(
        {"messages": counts[0]["messages"], "tools": counts[0].get("tools")})
    assert after["estimated_tokens"] == fake_openai.count_of(
        {"messages": counts[1]["messages"], "tools": counts[1].get("tools")})
    send = [f for f in frames if f["type"] == "context" and f["reason"] == "send"][0]
    assert send["tokens_source"] == "estimate"  # the count plus the new message's estimate
    assert after["estimated_tokens"] < send["estimated_tokens"] < after["estimated_tokens"] + 30


async def test_a_count_that_hangs_never_holds_a_send(tmp_path: Any, fake_openai: FakeProvider) -> None:
    fake_openai.counter = "vllm"
    fake_openai.count_hold = hold = threading.Event()
    try:
        with serve(settings(tmp_path, fake_openai)) as address:
            async with client(address) as c:
                await c.hello()
                with anyio.fail_after(10):  # generous; the count is held until the end
                    frames = await c.say("hello while the count hangs")
                assert frames[-1]["type"] == "done"
                assert not [f for f in c.frames if f["type"] == "context" and f["reason"] == "count"]
    finally:
        hold.set()


async def test_a_stale_count_is_dropped(tmp_path: Any, fake_openai: FakeProvider) -> None:
    # The count of the opened session arrives after a message was sent: it counts an old history.
    fake_openai.counter = "vllm"
    fake_openai.count_hold = hold = threading.Event()
    fake_openai.enqueue(Reply(text=["a reply"], usage=(50, 2)))
    try:
        with serve(settings(tmp_path, fake_openai)) as address:
            async with client(address) as c:
                await c.hello()
                frames = await c.say("hello")
                hold.set()
                after = await counted_frame(c)  # the count asked after the turn: of the new history
        assert frames[-1]["type"] == "done"
        assert "hello" in str(fake_openai.count_requests[-1].json["messages"])
        assert after["estimated_tokens"] == fake_openai.count_of(
            {"messages": fake_openai.count_requests[-1].json["messages"],
             "tools": fake_openai.count_requests[-1].json.get("tools")})
    finally:
        hold.set()


async def test_window_named_by_a_count_is_the_routes_discovered_window(
    tmp_path: Any, fake_openai: FakeProvider
) -> None:
    fake_openai.counter, fake_openai.count_window = "llamacpp", 12288  # /props' n_ctx
    profile = {"kind": "openai", "base_url": fake_openai.base_url, "model": "m"}  # /v1/models: no card
    with serve(settings_for(tmp_path, {"providers": {"p": profile}})) as address:
        async with client(address) as c:
            opened = await c.hello()
            counted = await counted_frame(c)
    assert "model_context_window" not in opened[-1]  # nothing published it
    assert (counted["model_context_window"], counted["window_source"]) == (12288, "provider")
