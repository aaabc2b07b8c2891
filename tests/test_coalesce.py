"""``coalesce``: what piles up in an outbox leaves as fewer frames, with exact text and seq."""

from __future__ import annotations

from server.sessions.channel import Packet
from server.web.connection import coalesce


def chunk(seq: int, text: str, turn: str = "t") -> Packet:
    return Packet.of({"type": "chunk", "turn_id": turn, "content": text, "seq": seq})


def other(seq: int) -> Packet:
    return Packet.of({"type": "context", "reason": "usage", "seq": seq})


def test_coalesce_joins_a_run_of_chunks_into_one_frame_with_the_last_seq():
    packets = [chunk(1, "a"), chunk(2, "b"), chunk(3, "c")]
    (joined,) = coalesce(packets)
    assert joined.decoded() == {"type": "chunk", "turn_id": "t", "content": "abc", "seq": 3}
    assert joined.seq == 3 and joined.size == sum(p.size for p in packets)  # what the outbox counted


def test_coalesce_keeps_other_frames_and_turns_apart_and_in_order():
    packets = [chunk(1, "a"), other(2), chunk(3, "b"), chunk(4, "c"), chunk(5, "x", turn="u")]
    frames = [p.decoded() for p in coalesce(packets)]
    assert [(f["type"], f.get("content"), f["seq"]) for f in frames] == [
        ("chunk", "a", 1), ("context", None, 2), ("chunk", "bc", 4), ("chunk", "x", 5)]


def test_coalesce_leaves_a_lone_chunk_and_replayed_frames_as_they_came():
    lone = chunk(1, "a")
    replayed = [Packet(2, lone.text.replace('"seq":1', '"seq":2')), Packet(3, lone.text)]
    result = coalesce([lone, *replayed])
    assert result[0] is lone and result[1:] == replayed  # resume sends exactly what was logged
