"""Whole turns through the real app against fake providers of each dialect (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import pytest

from server.history.messages import BREADCRUMB_TEXT
from tests.fakes import Call, FakeAnthropic, FakeOllama, FakeOpenAI, Reply
from tests.mcp_support import faulty_server
from tests.support import client, of_type, serve, settings_for, text_of

pytestmark = pytest.mark.anyio

DIALECTS = ["openai", "anthropic", "ollama"]


@pytest.fixture
def fakes(fake_openai, fake_anthropic, fake_ollama):
    return {"openai": fake_openai, "anthropic": fake_anthropic, "ollama": fake_ollama}


def profile(kind: str, fake, **extra):
    return {"kind": kind, "base_url": fake.base_url, "model": "m1", "discover_window": False, **extra}


def settings(tmp_path, kind, fake, runtime=None, **extra):
    data = {"providers": {kind: profile(kind, fake, **extra)}, "runtime": runtime or {}}
    return settings_for(tmp_path, data)


def overflow(kind: str) -> Reply:
    if kind == "openai":
        return FakeOpenAI.overflow(flavor="openai")
    if kind == "anthropic":
        return FakeAnthropic.overflow()
    return FakeOllama.overflow("the input length exceeds the context length")


@pytest.mark.parametrize("kind", DIALECTS)
async def test_conversation_works_against_each_dialect(tmp_path, fakes, kind):
    fake = fakes[kind]
    fake.split = (1, 2, 3, 5, 7)
    fake.enqueue(Reply(text=["Héllo ", "wörld ", "✓"], usage=(120, 3)))
    with serve(settings(tmp_path, kind, fake)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("first question")
            second = await c.say("second question")
    done = frames[-1]
    assert done["full_response"] == "Héllo wörld ✓" == text_of(frames)
    assert (done["input_tokens"], done["output_tokens"], done["provider"]) == (120, 3, kind)
    assert second[-1]["full_response"] == "echo: second question"
    sent = fake.requests[-1].json
    texts = str(sent)
    assert "first question" in texts and "Héllo wörld ✓" in texts and "second question" in texts


OVERFLOWS = [("openai", "openai"), ("openai", "vllm_old"), ("openai", "vllm_new"), ("openai", "llamacpp"),
             ("openai", "llamacpp_500"), ("anthropic", None), ("ollama", None)]


@pytest.mark.parametrize("kind, flavor", OVERFLOWS)
async def test_overflow_error_trims_and_retries_smaller(tmp_path, fakes, kind, flavor):
    fake = fakes[kind]
    with serve(settings(tmp_path, kind, fake)) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(4):
                await c.say(f"turn {n} " + "words " * 200)
            fake.enqueue(FakeOpenAI.overflow(flavor=flavor) if flavor else overflow(kind))
            frames = await c.say("the last straw")
    trimmed, = of_type(frames, "history_trimmed")
    assert trimmed["reason"] == "overflow_recovery" and trimmed["dropped_turns"] >= 1
    assert trimmed["tokens_after"] <= trimmed["token_budget"] < trimmed["tokens_before"]
    assert frames[-1]["type"] == "done"
    failed, retried = fake.requests[-2].json, fake.requests[-1].json
    assert len(str(retried)) < len(str(failed))
    assert BREADCRUMB_TEXT in str(retried) and "the last straw" in str(retried)


@pytest.mark.parametrize("kind", DIALECTS)
async def test_overflow_with_one_turn_left_says_why(tmp_path, fakes, kind):
    fake = fakes[kind]
    fake.enqueue(overflow(kind))
    with serve(settings(tmp_path, kind, fake)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("a single turn")
            error = frames[-1]
            assert error["type"] == "error" and error["code"] == "context_overflow_unrecoverable"
            assert "newest turn alone" in error["message"]
            again = await c.say("still alive")
    assert again[-1]["type"] == "done"


@pytest.mark.parametrize("kind", DIALECTS)
async def test_provider_dying_mid_stream_keeps_the_partial_reply(tmp_path, fakes, kind):
    fake = fakes[kind]
    fake.enqueue(Reply(text=["partial ", "answer "], ending="drop"))
    with serve(settings(tmp_path, kind, fake)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("tell me")
            error = frames[-1]
            assert error["type"] == "error" and error["retryable"] is True
            assert text_of(frames) == "partial answer "
            again = await c.say("again")
        async with client(address) as d:
            history = (await d.hello(c.session_id))[1]["messages"]
    assert again[-1]["type"] == "done"
    replies = [m for m in history if m["role"] == "assistant"]
    assert replies[0]["content"] == "partial answer " and replies[0]["interrupted"] is True
    assert replies[1]["interrupted"] is False
    assert [m["content"] for m in history if m["role"] == "user"] == ["tell me", "again"]


@pytest.mark.parametrize("status, code, retryable", [(429, "rate_limited", True), (401, "auth_error", False),
                                                     (503, "overloaded", True), (500, "unavailable", True)])
async def test_http_errors_become_error_frames(tmp_path, fake_openai, status, code, retryable):
    fake_openai.enqueue(Reply(status=status, error="nope", headers={"Retry-After": "7"}))
    with serve(settings(tmp_path, "openai", fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            error = (await c.say("hi"))[-1]
    assert (error["code"], error["retryable"]) == (code, retryable)
    if code == "rate_limited":
        assert error["retry_after"] == 7


async def test_token_budget_trims_whole_turns_with_breadcrumb(tmp_path, fake_openai):
    runtime = {"max_context_tokens": 400}
    with serve(settings(tmp_path, "openai", fake_openai, runtime)) as address:
        async with client(address) as c:
            await c.hello()
            trims = []
            for n in range(6):
                frames = await c.say(f"question {n} " + "x" * 300)
                trims += of_type(frames, "history_trimmed")
                assert frames[-1]["max_context_tokens"] == 400
    assert trims and all(t["reason"] == "token_budget" and t["token_budget"] == 400 for t in trims)
    assert all(t["tokens_after"] <= 400 < t["tokens_before"] for t in trims)
    assert all(len(t["message_ids"]) == t["dropped_messages"] for t in trims)
    last = fake_openai.requests[-1].json["messages"]
    assert sum(BREADCRUMB_TEXT in str(m["content"]) for m in last) == 1
    assert "question 5" in str(last[-1]) and "question 0" not in str(last)


async def test_turn_limit_keeps_newest_turns(tmp_path, fake_openai):
    with serve(settings(tmp_path, "openai", fake_openai, {"max_history_messages": 2})) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(3):
                frames = await c.say(f"q{n}")
    trimmed, = of_type(frames, "history_trimmed")
    assert trimmed["reason"] == "turn_limit" and trimmed["kept_turns"] == 2
    assert "token_budget" not in trimmed
    sent = str(fake_openai.requests[-1].json["messages"])
    assert "q0" not in sent and "q1" in sent and "q2" in sent


@pytest.mark.parametrize("runtime", [{}, {"max_context_tokens": 0}])
async def test_capacity_check_refuses_before_sending(tmp_path, fake_openai, runtime):
    with serve(settings(tmp_path, "openai", fake_openai, runtime, context_window=300)) as address:
        async with client(address) as c:
            await c.hello()
            error = (await c.say("y" * 2000))[-1]
            assert error["code"] == "capacity_exceeded" and "tokens over" in error["message"]
            assert fake_openai.requests == []
            assert (await c.say("short"))[-1]["type"] == "done"


async def test_tool_cap_ends_with_a_final_call_without_tools(tmp_path, fake_openai):
    fake_openai.default = lambda body: Reply(tool_calls=[Call("f__flood", {"size": 5000})])
    data = {"providers": {"openai": profile("openai", fake_openai)}, "mcp_servers": {"f": faulty_server()},
            "runtime": {"max_tool_iterations": 2, "max_tool_result_chars": 500}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("loop forever")
    assert len(fake_openai.requests) == 3
    assert all("tools" in r.json for r in fake_openai.requests[:2])
    final = fake_openai.requests[2].json
    assert "tools" not in final and "Tool limit reached" in str(final["messages"][-1])
    results = of_type(frames, "tool_result")
    assert len(results) == 2 and all("characters truncated" in r["output"] for r in results)
    assert frames[-1]["type"] == "done"


async def test_retry_of_replaces_the_failed_turn(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(status=503, error="busy"))
    with serve(settings(tmp_path, "openai", fake_openai)) as address:
        async with client(address) as c:
            await c.hello()
            failed = (await c.say("the question"))[-1]
            assert failed["code"] == "overloaded" and failed["retryable"] is True
            frames = await c.say("the question", retry_of=failed["turn_id"])
            assert frames[-1]["full_response"] == "echo: the question"
            await c.send("message", id="bad", content="x", retry_of="no-such-turn")
            error = await c.recv()
            assert error["code"] == "bad_frame" and error["message_id"] == "bad"
        async with client(address) as d:
            history = (await d.hello(c.session_id))[1]["messages"]
    assert str(fake_openai.requests[-1].json["messages"]).count("the question") == 1
    first = [m for m in history if m.get("turn_id") == failed["turn_id"]]
    assert first and all(m["excluded"] == "replaced by a retry" for m in first)


async def test_overflow_on_the_final_call_still_gets_a_final_answer(tmp_path, fake_openai):
    with serve(settings(tmp_path, "openai", fake_openai, {"max_tool_iterations": 1})) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(3):
                await c.say(f"turn {n} " + "words " * 200)
            fake_openai.enqueue(Reply(tool_calls=[Call("lookup_document", {"title": "paper moon"})]),
                                FakeOpenAI.overflow(flavor="openai"))
            frames = await c.say("one more")
    assert of_type(frames, "history_trimmed")[0]["reason"] == "overflow_recovery"
    assert frames[-1]["type"] == "done" and frames[-1]["full_response"].startswith("echo:")
    assert "tools" not in fake_openai.requests[-1].json


async def test_ollama_silent_truncation_is_noticed(tmp_path, fake_ollama):
    fake_ollama.enqueue(Reply(text=["fine"], usage=(1000, 2)), Reply(text=["sure"], usage=(300, 2)))
    with serve(settings(tmp_path, "ollama", fake_ollama)) as address:
        async with client(address) as c:
            await c.hello()
            first = await c.say("a " * 3000)
            second = await c.say("b " * 1000)
    assert not of_type(first, "notice")
    notice, = of_type(second, "notice")
    assert notice["code"] == "provider_truncated" and "num_ctx" in notice["message"]
    assert second[-1]["type"] == "done"


async def test_reply_cut_at_the_output_limit_is_noticed(tmp_path, fake_anthropic):
    fake_anthropic.enqueue(Reply(text=["half a sen"], finish="max_tokens"))
    with serve(settings(tmp_path, "anthropic", fake_anthropic, {"max_output_tokens": 64})) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("write a long essay")
    notice, = of_type(frames, "notice")
    assert notice["code"] == "reply_truncated" and "64" in notice["message"]
    assert frames[-1]["type"] == "done" and frames[-1]["full_response"] == "half a sen"
