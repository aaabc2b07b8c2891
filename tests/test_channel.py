from __future__ import annotations

from server.channel import FrameChannel, FrameLog, Outbox, frame_bytes
from server.events import EventBus


def chunk(seq: int, text: str = "x" * 100) -> dict:
    return {"type": "chunk", "turn_id": "t", "content": text, "seq": seq}


def test_frame_log_replays_exactly_what_came_after():
    log = FrameLog()
    for seq in range(1, 11):
        log.append(chunk(seq))
    assert [f["seq"] for f in log.after(7)] == [8, 9, 10]
    assert log.after(10) == []


def test_frame_log_is_bounded_by_size_and_says_when_it_cannot_reach_back():
    log = FrameLog(limit_bytes=10 * frame_bytes(chunk(0)))
    for seq in range(1, 101):
        log.append(chunk(seq))
    assert len(log) == 10 and log.bytes <= log.limit_bytes
    assert [f["seq"] for f in log.after(90)] == list(range(91, 101))
    assert log.after(50) is None


def test_frame_log_keeps_the_newest_frame_even_when_it_alone_is_over_the_limit():
    log = FrameLog(limit_bytes=10)
    log.append(chunk(1, "y" * 1000))
    assert len(log) == 1 and log.after(0)[0]["seq"] == 1


def test_channel_replay_refuses_numbers_from_another_incarnation():
    channel = FrameChannel("s", EventBus(), first_seq=1000)
    for _ in range(3):
        channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    assert [f["seq"] for f in channel.replay_after(1001)] == [1002, 1003]
    assert channel.replay_after(5) is None and channel.replay_after(2000) is None


def head(seq: int) -> dict:
    return {"type": "session", "seq": seq}


def test_channel_attach_replays_what_the_client_missed():
    channel = FrameChannel("s", EventBus())
    for _ in range(3):
        channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    outbox = Outbox()
    assert channel.attach(outbox, 1, head=head, snapshot=lambda: [{"type": "history"}])
    assert [(f["type"], f["seq"]) for f in outbox.frames] == [("session", 1), ("chunk", 2), ("chunk", 3)]
    channel.emit({"type": "chunk", "turn_id": "t", "content": "b"})
    assert outbox.frames[-1]["seq"] == 4  # attached: later frames follow


def test_channel_attach_sends_a_snapshot_when_the_log_cannot_reach_back():
    channel = FrameChannel("s", EventBus(), first_seq=50)
    channel.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    for last_seq in (None, 7):
        outbox = Outbox()
        assert not channel.attach(outbox, last_seq, head=head, snapshot=lambda: [{"type": "history"}])
        assert [f["type"] for f in outbox.frames] == ["session", "history"]
        assert outbox.frames[0]["seq"] == 51


def test_channel_detach_says_when_nobody_watches():
    channel = FrameChannel("s", EventBus())
    first, second = Outbox(), Outbox()
    for outbox in (first, second):
        channel.attach(outbox, None, head=head, snapshot=list)
    assert channel.watched and not channel.detach(first) and channel.detach(second)
    assert not channel.watched
