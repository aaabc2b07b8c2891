"""``ReplyWriter`` without sockets or stores: pieces in, steps and messages out."""

from __future__ import annotations

import pytest

from server.history.messages import ToolCall
from server.sessions.reply import ReplyWriter, Step


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_reply_writer_joins_at_the_first_piece_and_flushes_one_interval_later():
    clock = Clock()
    writer = ReplyWriter("t1", flush_seconds=0.5, clock=clock)
    assert not writer.joined and writer.current() is None
    assert writer.append("Hel") is Step.JOIN and writer.joined
    clock.now += 0.2
    assert writer.append("lo") is Step.NONE
    clock.now += 0.3
    assert writer.append(",") is Step.FLUSH
    saved = writer.flush()
    assert saved.content == "Hello," and saved.interrupted  # interrupted until finished
    assert writer.append(" world") is Step.NONE


def test_reply_writer_finish_gives_the_complete_message_and_starts_over():
    writer = ReplyWriter("t1", flush_seconds=1.0)
    writer.append("an ")
    writer.append("answer")
    message = writer.finish(interrupted=False)
    assert message is not None
    assert (message.content, message.interrupted, message.turn_id, message.tool_calls) == \
        ("an answer", False, "t1", None)
    assert message.text_tokens == 7  # 9 bytes -> 3 tokens + 4 overhead, measured on the final text
    assert not writer.joined and writer.finish(interrupted=True) is None


def test_reply_writer_keeps_a_reply_of_tool_calls_only():
    writer = ReplyWriter("t1", flush_seconds=1.0)
    calls = [ToolCall("c1", "lookup", {"q": "x"})]
    message = writer.finish(interrupted=False, tool_calls=calls)
    assert message is not None and message.content == "" and message.tool_calls == calls
    assert message.text_tokens > 4  # the calls count in the estimate


def test_reply_writer_refuses_a_flush_before_the_first_piece():
    with pytest.raises(RuntimeError, match="before the first piece"):
        ReplyWriter("t1", flush_seconds=1.0).flush()


def test_reply_writer_joins_pieces_incrementally_across_flushes():
    clock = Clock()
    writer = ReplyWriter("t1", flush_seconds=0.5, clock=clock)
    for n in range(10):
        writer.append(f"p{n} ")
        clock.now += 0.3
        if n % 3 == 0 and writer.joined:
            assert writer.flush().content == "".join(f"p{k} " for k in range(n + 1))
    message = writer.finish(interrupted=False)
    assert message is not None and message.content == "".join(f"p{k} " for k in range(10))


def test_reply_writer_dates_the_message_when_its_call_began() -> None:
    writer = ReplyWriter("t1", flush_seconds=1.0)
    writer.began = "2026-11-30T10:00:00.000001+00:00"  # the call's route frame
    writer.append("hello")
    message = writer.finish(interrupted=True)
    assert message is not None and message.created_at == "2026-11-30T10:00:00.000001+00:00"
    writer.began = "2026-11-30T10:00:05.000001+00:00"  # the next call: tool calls only, no text
    asked = writer.finish(interrupted=False, tool_calls=[ToolCall("c1", "lookup", {})])
    assert asked is not None and asked.created_at == "2026-11-30T10:00:05.000001+00:00"
