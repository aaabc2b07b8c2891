from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.sessions.channel import (
    LOG_ENTRY_OVERHEAD,
    FrameChannel,
    FrameLog,
    Outbox,
    Packet,
    entry_bytes,
    serialize,
)
from server.sessions.events import OBSERVED_TYPES, EventBus


def chunk(seq: int, text: str = "x" * 100) -> dict:
    return {"type": "chunk", "turn_id": "t", "content": text, "seq": seq}


def log_chunk(log: FrameLog, seq: int, text: str = "x" * 100) -> None:
    log.append(seq, serialize(chunk(seq, text)))


def test_frame_log_replays_exactly_what_came_after():
    log = FrameLog()
    for seq in range(1, 11):
        log_chunk(log, seq)
    assert [p.seq for p in log.after(7)] == [8, 9, 10]
    assert [p.decoded() for p in log.after(7)] == [chunk(8), chunk(9), chunk(10)]
    assert log.after(10) == []


def test_frame_log_is_bounded_by_size_and_says_when_it_cannot_reach_back():
    log = FrameLog(limit_bytes=10 * entry_bytes(serialize(chunk(100))))
    for seq in range(1, 101):
        log_chunk(log, seq)
    assert len(log) == 10 and log.bytes <= log.limit_bytes
    assert [p.seq for p in log.after(90)] == list(range(91, 101))
    assert log.after(50) is None


def test_frame_log_keeps_the_newest_frame_even_when_it_alone_is_over_the_limit():
    log = FrameLog(limit_bytes=10)
    log_chunk(log, 1, "y" * 1000)
    assert len(log) == 1 and log.after(0)[0].seq == 1


def test_channel_replay_refuses_numbers_from_another_incarnation():
    channel = FrameChannel("s", EventBus(), first_seq=1000)
    for _ in range(3):
        channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    assert [p.seq for p in channel.replay_after(1001)] == [1002, 1003]
    assert channel.replay_after(5) is None and channel.replay_after(2000) is None


def head(seq: int) -> dict:
    return {"type": "session", "seq": seq}


def test_channel_attach_replays_what_the_client_missed():
    channel = FrameChannel("s", EventBus())
    for _ in range(3):
        channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    outbox = Outbox()
    assert channel.attach(outbox, 1, head=head, snapshot=lambda: [{"type": "history"}])
    sent = [p.decoded() for p in outbox.frames]
    assert [(f["type"], f["seq"]) for f in sent] == [("session", 1), ("chunk", 2), ("chunk", 3)]
    assert [p.seq for p in outbox.frames] == [1, 2, 3]
    channel.emit({"type": "chunk", "turn_id": "t", "content": "b"})
    assert outbox.frames[-1].seq == 4 and outbox.frames[-1].decoded()["seq"] == 4  # later frames follow


def test_channel_attach_sends_a_snapshot_when_the_log_cannot_reach_back():
    channel = FrameChannel("s", EventBus(), first_seq=50)
    channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    for last_seq in (None, 7):
        outbox = Outbox()
        assert not channel.attach(outbox, last_seq, head=head, snapshot=lambda: [{"type": "history"}])
        assert [p.decoded()["type"] for p in outbox.frames] == ["session", "history"]
        assert outbox.frames[0].decoded()["seq"] == 51


def test_channel_detach_says_when_nobody_watches():
    channel = FrameChannel("s", EventBus())
    first, second = Outbox(), Outbox()
    for outbox in (first, second):
        channel.attach(outbox, None, head=head, snapshot=list)
    assert channel.watched and not channel.detach(first) and channel.detach(second)
    assert not channel.watched


def test_channel_serializes_each_frame_once_for_every_outbox_and_the_log():
    channel = FrameChannel("s", EventBus())
    first, second = Outbox(), Outbox()
    for outbox in (first, second):
        channel.attach(outbox, None, head=head, snapshot=list)
    channel.emit({"type": "chunk", "turn_id": "t", "content": "é"})
    assert first.frames[-1] is second.frames[-1]  # one packet, one text
    assert channel.log.after(0)[-1].text is first.frames[-1].text
    assert first.frames[-1].decoded() == {"type": "chunk", "turn_id": "t", "content": "é", "seq": 1}


def test_outbox_counts_wire_bytes_and_says_when_the_client_is_too_far_behind():
    outbox = Outbox(limit_bytes=150)
    wide = Packet.of(chunk(1, "€" * 20))  # three UTF-8 bytes per character
    assert wide.size == len(wide.text.encode("utf-8")) == len(wide.text) + 40
    outbox.push(wide)
    assert outbox.bytes == wide.size and not outbox.overflowed
    outbox.push(Packet.of(chunk(2)))
    assert outbox.overflowed
    taken = outbox.take()
    assert not outbox.frames and outbox.bytes == sum(p.size for p in taken)
    for packet in taken:
        outbox.sent(packet.size)
    assert outbox.bytes == 0


def test_frame_log_counts_what_its_texts_hold_and_forgets_across_a_gap():
    log = FrameLog()
    for seq in (1, 2, 3):
        log_chunk(log, seq)
    assert log.bytes == sum(entry_bytes(serialize(chunk(seq))) for seq in (1, 2, 3))
    log_chunk(log, 7)  # a gap: 4..6 were never logged, so nothing before 7 can be replayed
    assert len(log) == 1 and log.after(2) is None and [p.seq for p in log.after(6)] == [7]


@given(st.text())
def test_a_logged_text_counts_what_sys_getsizeof_says_it_holds(text):
    # ASCII texts are counted without calling sys.getsizeof (the hot path): the same figure.
    assert entry_bytes(text) == sys.getsizeof(text) + LOG_ENTRY_OVERHEAD
    assert entry_bytes(text.encode("ascii", "replace").decode()) == \
        sys.getsizeof(text.encode("ascii", "replace").decode()) + LOG_ENTRY_OVERHEAD


@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**70))
def test_a_chunk_frame_is_serialized_as_json_dumps_would(turn_id, content, seq):
    # The chunk's own template (the hot path) must give the very text json.dumps gives: lone
    # surrogates, control characters, quotes, U+2028 and big seqs included.
    frame = {"type": "chunk", "turn_id": turn_id, "content": content, "seq": seq}
    assert serialize(frame) == json.dumps(frame, ensure_ascii=False, separators=(",", ":"))


def test_an_unusual_chunk_frame_falls_back_to_json_dumps():
    extra = {"type": "chunk", "turn_id": "t", "content": "a", "seq": 1, "more": [1]}
    odd = {"type": "chunk", "turn_id": None, "content": "a", "seq": True}
    for frame in (extra, odd):
        assert json.loads(serialize(frame)) == frame


@pytest.mark.anyio
async def test_channel_publishes_every_observed_frame_type_to_the_bus():
    # emit skips the bus for chunks (the bus observes none): a type added to what the bus
    # observes must still reach its subscribers, a chunk included.
    bus = EventBus()
    subscription = bus.subscribe()
    channel = FrameChannel("s", bus)
    for kind in OBSERVED_TYPES:
        channel.emit({"type": kind, "turn_id": "t", "content": "a"})
    channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    assert subscription.pending == len(OBSERVED_TYPES)
    assert [(await subscription.next() or {}).get("type") for _ in OBSERVED_TYPES] == list(OBSERVED_TYPES)
