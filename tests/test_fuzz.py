"""Hostile client frames against a real server over a real WebSocket: every one answered, no
connection dropped, no traceback logged, and the session still answers afterwards. The fuzz loop
is bench/fuzz.py's (which runs 100,000 frames); here it runs a few thousand."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings

from bench.fuzz import FuzzRun, LogCapture, batches
from tests.support import DEMO, client, of_type, serve, settings_for

FUZZ_BATCHES = 500  # about 3,000 frames (a batch holds 1 to 12)
# A window the fuzz cannot fill: this test is about the protocol. (Filled to within the tool schema's
# tokens of a 4,096 window, a session refuses every later message as capacity_exceeded, because the
# budget trim leaves the tool schema out of its estimate; bench/fuzz.py --window 4096 shows it.)
WIDE_DEMO = {"providers": {"demo": {**DEMO, "context_window": 1_000_000}}}

# The fuzz sends frames as fast as it can: the frame-rate limit (tests/test_limits.py) is lifted here.
UNLIMITED = {"frame_rate": 1e9, "frame_burst": 1_000_000}

HOSTILE = [
    "[" * 100_000 + "]" * 100_000,
    '{"type": "message", "id": "deep", "content": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"type": "hello", "last_seq": ' + "1" * 4301 + "}",
    '{"type": "message", "id": "big", "content": "x", "images": [' + "7" * 10_000 + "]}",
    '{"type": "message", "id": "sur", "content": "\\ud800"}',
    '{"type": "hello", "session_id": "\\ud800"}',
    '{"type": "\\udfff"}',
    '{"type": "switch_model", "route": "\\ud800' + "r" * 5000 + '"}',
    '{"type": "message", "id": "img", "content": "x", "images": [{"media_type": "\\ud800", "data": ""}]}',
    '{"type": "hello", "last_seq": NaN}',
    "[1, 2]",
]


ANSWERED_WITHOUT_ERROR = {4}  # the lone surrogate in content: made valid, accepted, answered


async def answers_to(c, raw: str) -> list[dict]:
    """Frames up to the error of a marker frame sent after ``raw`` (frames are handled in order)."""
    await c.send_raw(raw)
    await c.send("hello")  # this connection already said hello: its error closes raw's answers
    answers = await c.until("error")
    while "already said hello" not in answers[-1]["message"]:
        answers += await c.until("error")
    return answers[:-1]


async def answer_to_message(c, message_id, content):
    """The frame that ends this message: its own `busy` error, or its turn's done/error/aborted (a
    stopped earlier turn's `aborted` may arrive in between and is not this message's answer)."""
    await c.send("message", id=message_id, content=content)
    turn_id = None
    while True:
        frame = await c.recv()
        if frame["type"] == "accepted" and frame.get("id") == message_id:
            turn_id = frame["turn_id"]
        elif frame["type"] == "error" and frame.get("message_id") == message_id:
            return frame
        elif frame["type"] in ("done", "error", "aborted") and turn_id and frame.get("turn_id") == turn_id:
            return frame


@pytest.mark.anyio
async def test_fuzz_each_known_killer_frame_is_answered(tmp_path):
    with serve(settings_for(tmp_path, **UNLIMITED)) as address, LogCapture() as logs:
        async with client(address) as c:
            await c.hello()
            for index, raw in enumerate(HOSTILE):
                answers = await answers_to(c, raw)
                errors = of_type(answers, "error")
                assert bool(errors) != (index in ANSWERED_WITHOUT_ERROR), (index, answers)
                assert all(len(error["message"]) < 700 for error in errors)
            await c.send("stop")  # a hostile frame may have started a turn: it ends, aborted
            for attempt in range(20):
                outcome = await answer_to_message(c, f"still-{attempt}", "still there?")
                if outcome.get("code") != "busy":
                    break
    assert outcome["type"] == "done"
    assert logs.records == []


@pytest.mark.anyio
async def test_fuzz_lone_surrogate_in_content_is_stored_as_a_replacement_character(tmp_path):
    with serve(settings_for(tmp_path, **UNLIMITED)) as address:
        async with client(address) as c:
            await c.hello()
            await c.send_raw('{"type": "message", "id": "s1", "content": "half \\ud83d pair"}')
            frames = await c.until("done", "error")
        async with client(address) as again:
            history = of_type(await again.hello(c.session_id), "history")[0]
    assert frames[-1]["type"] == "done"
    assert of_type(frames, "accepted")[0]["content"] == "half \ufffd pair"
    assert [m["content"] for m in history["messages"] if m["id"] == "s1"] == ["half \ufffd pair"]


def test_fuzz_the_client_protocol(tmp_path):
    with serve(settings_for(tmp_path, WIDE_DEMO, **UNLIMITED)) as address, LogCapture() as logs:
        run = FuzzRun(address)
        started = time.perf_counter()

        @settings(max_examples=FUZZ_BATCHES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(batches())
        def one(batch):
            run.run_batch(*batch)

        one()
        seconds = time.perf_counter() - started
        usable = run.session_answers()
    report = run.report(seconds, logs)
    print(report)
    assert run.frames >= 2000, report
    assert run.drops == [], report
    assert logs.tracebacks == [] and logs.records == [], report
    assert usable == "done", report + f"\nafterwards: {usable}"
    assert sum(run.errors.values()) > run.frames // 2, report  # the frames were hostile, and answered
    json.dumps(report)
