"""The context meter follows the route that serves each call: hints, switches, known and unknown
capacity, discovery, calibration, the switch pre-flight."""

from __future__ import annotations

import pytest

from tests.fakes import Reply
from tests.support import DEMO, client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio


def two_providers(fake, **runtime):
    return {
        "providers": {
            "demo": DEMO,
            "big": {"kind": "openai", "base_url": fake.base_url, "model": "big-1", "context_window": 100000,
                    "discover_window": False, "price_input_per_mtok": 2.0, "price_output_per_mtok": 8.0},
        },
        "model_routes": [{"hint": "deep", "provider": "big", "model": "big-1"}],
        "classifier": {"rules": [{"hint": "deep", "keywords": ["THEOREM"], "priority": 5},
                                 {"hint": "nowhere", "patterns": ["zzz"]}]},
        "runtime": runtime,
    }


async def test_hint_routes_one_call_and_the_meter_returns(tmp_path, fake_openai):
    fake_openai.enqueue(Reply(text=["proof"], usage=(900, 10)))
    with serve(settings_for(tmp_path, two_providers(fake_openai))) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("prove this theorem please")
            hinted, = [f for f in of_type(frames, "context") if f["reason"] == "hint"]
            assert (hinted["provider"], hinted["model"], hinted["route_kind"]) == ("big", "big-1", "hint")
            assert hinted["model_context_window"] == 100000
            route, = of_type(frames, "route")
            assert route["hint"] == "deep" and route["provider"] == "big"
            done = frames[-1]
            assert (done["provider"], done["model"], done["model_context_window"]) == ("big", "big-1", 100000)
            assert done["cost_usd"] == pytest.approx((900 * 2.0 + 10 * 8.0) / 1e6)
            back = await c.until("context")
            assert back[-1]["reason"] == "done" and back[-1]["model"] == "demo-small"
            assert back[-1]["route_kind"] == "default"
            plain = await c.say("hello")
    assert plain[-1]["provider"] == "demo" and "cost_usd" not in plain[-1]


async def test_hint_naming_no_route_falls_back_to_the_session_route(tmp_path, fake_openai):
    with serve(settings_for(tmp_path, two_providers(fake_openai))) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("zzz sleepy")
    route = of_type(frames, "route")[0]
    assert (route["provider"], route["route_kind"], route["hint"]) == ("demo", "fallback", "nowhere")


async def test_hint_prefix_picks_the_route_and_is_stripped(tmp_path, fake_openai):
    with serve(settings_for(tmp_path, two_providers(fake_openai))) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("/hint deep what is 2+2")
    assert frames[0]["content"] == "what is 2+2"
    assert frames[-1]["provider"] == "big" and frames[-1]["full_response"] == "echo: what is 2+2"


async def test_mismatched_model_never_borrows_the_profile_window(tmp_path, fake_openai):
    with serve(settings_for(tmp_path, two_providers(fake_openai))) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("switch_model", route="big/other-model")
            context = (await c.until("context"))[-1]
            assert context["model"] == "other-model" and "model_context_window" not in context
            await c.send("switch_model", route="big")
            context = (await c.until("context"))[-1]
    assert context["model"] == "big-1" and context["model_context_window"] == 100000


async def test_switch_to_smaller_model_previews_the_trim(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("switch_model", route="demo/demo-open")
            await c.until("context")
            titles = ("paper moon", "seventh garden", "spark train", "harbour letters", "chess in the rain")
            for title in titles:
                frames = await c.say(f"look up {title}")
                assert not of_type(frames, "history_trimmed")
            await c.send("switch_model", route="demo/demo-small")
            context = (await c.until("context"))[-1]
            assert context["model_context_window"] == 4096
            preview = context["trim_preview"]
            assert preview["turns"] >= 1 and preview["tokens"] > 0
            frames = await c.say("what do you see now?")
    trimmed, = of_type(frames, "history_trimmed")
    assert trimmed["dropped_turns"] == preview["turns"]


async def test_window_discovered_from_vllm_metadata(tmp_path, fake_openai):
    fake_openai.models = {"served": {"max_model_len": 8192}}
    data = {"providers": {"vllm": {"kind": "openai", "base_url": fake_openai.base_url, "model": "served"}}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            context = (await c.hello())[-1]
    assert context["model_context_window"] == 8192 and context["window_source"] == "provider"
    assert context["context_token_budget"] == 8192


async def test_calibration_brings_the_estimate_near_the_provider_count(tmp_path, fake_openai):
    # The fake's tokenizer counts 1.5x our estimate: by the third turn the pre-send figure is close.
    def reply(body):
        estimate = sum(len(str(m.get("content", "")).encode()) // 4 + 4 for m in body["messages"])
        return Reply(text=["ok ", "fine"], usage=(int(estimate * 1.5), 2))
    fake_openai.default = reply
    data = {"providers": {"p": {"kind": "openai", "base_url": fake_openai.base_url, "model": "m",
                                "context_window": 100000, "tools": False}}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            await c.hello()
            errors = []
            for n in range(3):
                frames = await c.say(f"turn {n}: " + "lorem ipsum " * (20 + 10 * n))
                contexts = of_type(frames, "context")
                sent = [f for f in contexts if f["reason"] == "send"][-1]["estimated_tokens"]
                reported = [f for f in contexts if f["reason"] == "usage"][-1]["estimated_tokens"]
                errors.append(abs(sent - reported) / reported)
    assert errors[0] > 0.2 and errors[2] < 0.10


async def test_window_discovered_from_ollama_show_uses_the_effective_num_ctx(tmp_path, fake_ollama):
    fake_ollama.models = {"llama3": {"context_length": 131072, "num_ctx": 8192, "arch": "llama"}}
    data = {"providers": {"local": {"kind": "ollama", "base_url": fake_ollama.base_url, "model": "llama3"}}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            context = (await c.hello())[-1]
    assert context["model_context_window"] == 8192 and context["window_source"] == "provider"


async def test_window_discovered_from_openrouter_context_length(tmp_path, fake_openai):
    fake_openai.models = {"meta/llama-3-8b": {"context_length": 8000}}
    data = {"providers": {"or": {"kind": "openai", "base_url": fake_openai.base_url,
                                 "model": "meta/llama-3-8b"}}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            context = (await c.hello())[-1]
            await c.send("switch_model", route="or/meta/unlisted")
            other = (await c.until("context"))[-1]
    assert context["model_context_window"] == 8000 and context["window_source"] == "provider"
    assert "model_context_window" not in other
