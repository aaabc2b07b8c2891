from __future__ import annotations

from server.events import EventBus
from server.history import ChatMessage
from server.live import FrameLog, LiveSession, frame_bytes
from server.routing import Route


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


def test_live_session_replay_refuses_numbers_from_another_incarnation():
    live = LiveSession("s", "t", Route("demo", "demo-small", "default"), [], EventBus(), first_seq=1000)
    for _ in range(3):
        live.emit({"type": "chunk", "turn_id": "t", "content": "a"})
    assert [f["seq"] for f in live.replay_after(1001)] == [1002, 1003]
    assert live.replay_after(5) is None and live.replay_after(2000) is None


def test_live_session_view_leaves_out_the_reply_being_written():
    live = LiveSession("s", "t", Route("demo", "demo-small", "default"), [], EventBus())
    user = ChatMessage("user", "hi", turn_id="t1")
    live.add(user)
    reply = ChatMessage("assistant", "partial", turn_id="t1")
    live.streaming = (reply, ["partial"])
    live.add(reply, sendable=False)
    live.rebuild()
    assert live.view() == [user]
    live.streaming = None
    live.complete(reply, listed=True)
    assert live.view() == [user, reply] and live.transcript == [user, reply]


def test_breadcrumb_only_for_turns_left_out_to_fit():
    route = Route("demo", "demo-small", "default")
    refused = ChatMessage("user", "too long", turn_id="t1", excluded="not sent: over the window")
    kept = ChatMessage("user", "next", turn_id="t2")
    live = LiveSession("s", "t", route, [refused, kept], EventBus())
    assert live.view() == [kept]  # a set-aside turn is not "omitted to fit the context window"
    trimmed = ChatMessage("user", "old", turn_id="t0", trimmed=True)
    live = LiveSession("s", "t", route, [trimmed, kept], EventBus())
    assert [m.breadcrumb for m in live.view()] == [True, False]
