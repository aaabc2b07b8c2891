"""The meter tells the truth (issue 10): one accounting for the meter, the trim notices, the trim
budget and the capacity check; the figure after a turn is the next send's; a window a provider names
in its overflow error is learned, kept and trimmed to; commands answer."""

from __future__ import annotations

import base64

import pytest

from server.history.messages import ChatMessage, Image, estimate_history_tokens
from server.routing.meter import tool_schema_tokens
from server.tools.demo import tool_specs
from tests.support import client, of_type, serve, settings_for

pytestmark = pytest.mark.anyio

PNG = {"media_type": "image/png", "data": base64.b64encode(b"\x89PNG....").decode()}


def contexts(frames, reason):
    return [f for f in frames if f["type"] == "context" and f["reason"] == reason]


async def test_meter_after_a_turn_shows_the_next_send_not_the_last(tmp_path):
    # Found on demo-small: after `echo` + 400 words the meter read the last call's input (775) while
    # the next send was about 1,099 and the provider counted 1,485.
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            first = await c.say("echo " + "word " * 400)
            after, = contexts(first, "done")
            last_count = contexts(first, "usage")[-1]["estimated_tokens"]
            # the reply just written is part of the next send
            assert after["estimated_tokens"] > last_count + 300
            second = await c.say("echo ok")
    counted = contexts(second, "usage")[0]["estimated_tokens"]
    assert abs(after["estimated_tokens"] - counted) / counted < 0.10


async def test_second_turn_with_an_image_trims_instead_of_refusing(tmp_path):
    # On the default demo the trim budget left out the tool schemas the capacity check counts:
    # a second image turn was refused ("4,098 > 4,096") instead of fitting or trimming.
    tools = tool_schema_tokens(tool_specs())
    image = Image("image/png", PNG["data"])
    for size in range(200, 12000, 4):
        text = "echo " + "x" * size
        history = [ChatMessage("user", text, images=[image]), ChatMessage("assistant", text[5:]),
                   ChatMessage("user", "echo hi", images=[image])]
        raw = estimate_history_tokens(history, 1000)
        if raw > 4096 - tools // 2:
            break
    assert 4096 - tools < raw <= 4096  # the history fits the old budget, the request did not
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            first = await c.say(text, images=[PNG])
            assert first[-1]["type"] == "done"
            frames = await c.say("echo hi", images=[PNG])
    assert frames[-1]["type"] == "done", frames[-1]
    send = contexts(frames, "send")[-1]
    assert send["estimated_tokens"] <= 4096


async def test_trim_notice_and_meter_use_one_accounting(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            for n in range(8):
                frames = await c.say(f"echo turn {n} " + "lorem ipsum " * 150)
                trims = of_type(frames, "history_trimmed")
                if trims:
                    break
    trimmed = trims[0]
    meter = contexts(frames, "trim")[0]
    send = contexts(frames, "send")[0]
    assert trimmed["tokens_after"] == meter["estimated_tokens"] == send["estimated_tokens"]
    assert trimmed["tokens_after"] <= trimmed["token_budget"] < trimmed["tokens_before"]
    assert trimmed["token_budget"] == meter["context_token_budget"] == 4096
    # the figure includes the tool schemas: the breakdown says how much
    assert meter["tool_schema_tokens"] > 0 and meter["trimmed_tokens"] > 0


async def test_done_says_how_many_calls_it_sums(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("look up paper moon")
    done = frames[-1]
    usage = [f["estimated_tokens"] for f in contexts(frames, "usage")]
    assert done["calls"] == len(usage) == 2
    assert done["input_tokens"] == sum(usage) and done["last_input_tokens"] == usage[-1]


async def test_context_frame_carries_its_breakdown(tmp_path):
    data = {"runtime": {"system_prompt": "You are terse. " * 20, "reply_reserve_tokens": 300}}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            hello = (await c.hello())[-1]
            frames = await c.say("echo hello there")
    assert hello["system_tokens"] > 60 and hello["tool_schema_tokens"] > 0
    assert hello["reply_reserve"] == 300 and hello["calibration_ratio"] == 1.0
    assert hello["estimated_tokens"] == (hello["system_tokens"] + hello["tool_schema_tokens"]
                                         + hello["history_tokens"] + hello["image_tokens"] + 300)
    after = contexts(frames, "done")[0]
    assert after["calibration_ratio"] != 1.0 and after["tokens_source"] == "estimate"  # the reply was added


async def test_window_named_by_an_overflow_is_learned_kept_and_trimmed_to(tmp_path):
    # demo-open publishes no window; its overflow error names 16,384. Found: "51%" of the 32,000
    # fallback, then an overflow, and the next turn overflowed again.
    settings = settings_for(tmp_path)
    block = "lorem ipsum dolor " * 700  # about 3,000 tokens each way
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m0", content="/model demo/demo-open")
            await c.until("context")
            turns = []
            for n in range(5):
                turns.append(await c.say(f"echo {n} {block}"))
    overflowed = [t for t in turns if any(f.get("reason") == "overflow_recovery" for f in t)]
    assert len(overflowed) == 1, "the window is learned from the first overflow"
    first = overflowed[0]
    learned, = [f for f in of_type(first, "notice") if f["code"] == "window_learned"]
    assert "16,384" in learned["message"]
    later = turns[turns.index(first) + 1:]
    assert later, "a turn after the overflow"
    for frames in later:
        assert frames[-1]["type"] == "done"
        send = contexts(frames, "send")[-1]
        assert send["model_context_window"] == 16384 and send["window_source"] == "provider_error"
        assert send["estimated_tokens"] <= 16384
    # kept in the store: a new server knows it before any overflow
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("switch_model", route="demo/demo-open")
            switched = (await c.until("context"))[-1]
    assert switched["model_context_window"] == 16384 and switched["window_source"] == "provider_error"


async def test_unknown_hint_is_answered_with_the_hints_that_exist(tmp_path):
    data = {"model_routes": [{"hint": "open", "provider": "demo", "model": "demo-open"}]}
    with serve(settings_for(tmp_path, data)) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.say("/hint code write a loop")
    notice, = of_type(frames, "notice")
    assert notice["code"] == "unknown_hint" and "'code'" in notice["message"]
    assert "open (demo/demo-open)" in notice["message"]
    assert frames[-1]["type"] == "done"


@pytest.mark.parametrize("command", ["/model", "/model nowhere/none"])
async def test_model_command_that_names_no_route_lists_the_routes(tmp_path, command):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m1", content=command)
            notice = (await c.until("notice", "error"))[-1]
    assert notice["type"] == "notice" and notice["code"] == "unknown_route"
    assert "demo/demo-small" in notice["message"] and "demo/demo-open" in notice["message"]
    assert "unknown provider ''" not in notice["message"]


async def test_switch_answers_with_the_new_routes_window_and_trim_preview(tmp_path):
    with serve(settings_for(tmp_path)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send("message", id="m1", content="/model demo/demo-open")
            switched = (await c.until("context"))[-1]
            assert switched["reason"] == "switch" and switched["model"] == "demo-open"
            assert "model_context_window" not in switched and switched["context_token_budget"] == 32000
            for n in range(4):
                await c.say(f"echo {n} " + "lorem ipsum " * 250)
            await c.send("switch_model", route="demo/demo-small")
            back = (await c.until("context"))[-1]
    assert back["reason"] == "switch" and back["model_context_window"] == 4096
    assert back["trim_preview"]["turns"] >= 1
