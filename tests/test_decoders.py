from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.providers.decoders import (
    LineDecoder,
    LineTooLong,
    NDJSONDecoder,
    SSEDecoder,
    SSEEvent,
    parse_json,
)

STREAM = (
    ": keepalive\n"
    "event: message_start\n"
    "data: {\"text\": \"héllo ✓ 🎉\"}\n"
    "\n"
    "data: first line\n"
    "data: second line\n"
    "id: 7\n"
    "retry: 1500\n"
    "\n"
    "data: [DONE]\n"
    "\n"
)
EXPECTED = [
    SSEEvent("message_start", '{"text": "héllo ✓ 🎉"}'),
    SSEEvent("message", "first line\nsecond line", "7", 1500),
    SSEEvent("message", "[DONE]", "7", 1500),
]


def _feed(decoder: SSEDecoder, data: bytes, cuts: list[int]) -> list[SSEEvent]:
    events: list[SSEEvent] = []
    start = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        events += decoder.feed(data[start:cut])
        start = cut
    return events + decoder.flush()


def test_sse_decoder_reads_whole_stream() -> None:
    assert _feed(SSEDecoder(), STREAM.encode(), []) == EXPECTED


def test_sse_decoder_accepts_each_line_ending() -> None:
    for newline in ("\r\n", "\r"):
        data = STREAM.replace("\n", newline).encode()
        assert _feed(SSEDecoder(), data, []) == EXPECTED, newline


def test_sse_decoder_same_events_when_fed_byte_by_byte() -> None:
    for newline in ("\n", "\r\n", "\r"):
        data = STREAM.replace("\n", newline).encode()
        assert _feed(SSEDecoder(), data, list(range(len(data)))) == EXPECTED, newline


@given(st.sampled_from(["\n", "\r\n", "\r"]), st.lists(st.integers(min_value=0, max_value=200)))
def test_sse_decoder_same_events_for_any_split(newline: str, cuts: list[int]) -> None:
    data = STREAM.replace("\n", newline).encode()
    assert _feed(SSEDecoder(), data, [c for c in cuts if c < len(data)]) == EXPECTED


def test_sse_decoder_skips_comments_and_events_without_data() -> None:
    data = b": ping\n\nevent: lonely\n\nevent: ping\ndata: {}\n\n"
    assert _feed(SSEDecoder(), data, []) == [SSEEvent("ping", "{}")]


def test_sse_decoder_field_without_space_and_unknown_fields() -> None:
    data = b"data:tight\nfoo: bar\ndata\n\n"
    assert _feed(SSEDecoder(), data, []) == [SSEEvent("message", "tight\n")]


def test_sse_decoder_flush_dispatches_unterminated_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.flush() == [SSEEvent("message", "[DONE]")]


def test_sse_decoder_replaces_invalid_utf8() -> None:
    assert _feed(SSEDecoder(), b"data: a\xffb\n\n", []) == [SSEEvent("message", "a\ufffdb")]


def test_line_decoder_crlf_split_across_chunks_is_one_line_end() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"one\r") == ["one"]
    assert decoder.feed(b"\ntwo\r") == ["two"]
    assert decoder.feed(b"\r") == [""]
    assert decoder.feed(b"three") == []
    assert decoder.flush() == ["three"]


def test_line_decoder_keeps_unicode_line_separators_inside_lines() -> None:
    decoder = LineDecoder()
    assert decoder.feed("a\u2028b\x0cc\n".encode()) == ["a\u2028b\x0cc"]


def test_ndjson_decoder_splits_lines_across_chunks() -> None:
    data = '{"a": "ü"}\r\n\n{"b": [1, 2]}\n{"c": true}'.encode()
    decoder = NDJSONDecoder()
    values = [value for index in range(len(data)) for value in decoder.feed(data[index : index + 1])]
    assert values + list(decoder.flush()) == [{"a": "ü"}, {"b": [1, 2]}, {"c": True}]


def test_line_decoder_refuses_a_line_over_the_limit_before_it_ends() -> None:
    decoder = LineDecoder(max_line_bytes=10)
    assert decoder.feed(b"0123456789\n") == ["0123456789"]
    assert decoder.feed(b"01234") == []
    with pytest.raises(LineTooLong, match="longer than 10 bytes"):
        decoder.feed(b"567890")  # no line end yet: the partial line alone is over the limit


def test_line_decoder_refuses_a_long_line_inside_one_chunk() -> None:
    with pytest.raises(LineTooLong):
        LineDecoder(max_line_bytes=10).feed(b"short\n" + b"x" * 11 + b"\nshort\n")


def test_sse_decoder_limit_counts_bytes_not_characters() -> None:
    decoder = SSEDecoder(max_line_bytes=12)
    assert decoder.feed("data: ééé\n\n".encode()) == [SSEEvent("message", "ééé")]  # 12 bytes
    with pytest.raises(LineTooLong):
        list(decoder.feed("data: ééé!\n\n".encode()))  # 10 characters, 13 bytes


def test_sse_decoder_refuses_an_event_whose_data_lines_never_end() -> None:
    decoder = SSEDecoder(max_line_bytes=64)
    assert decoder.feed(b"data: a\ndata: b\n\n") == [SSEEvent("message", "a\nb")]
    with pytest.raises(LineTooLong, match="an event longer than 64 bytes"):
        for _ in range(100):  # each line is short; the event they make is not
            list(decoder.feed(b"data: 0123456789\n"))


def test_sse_decoder_delivers_the_events_before_a_long_line_in_the_same_feed() -> None:
    # A reader that fell behind feeds many events at once: those before the bound still arrive.
    got: list[SSEEvent] = []
    with pytest.raises(LineTooLong):
        got.extend(SSEDecoder(max_line_bytes=16).feed(b"data: a\n\ndata: b\n\ndata: " + b"x" * 20 + b"\n\n"))
    assert got == [SSEEvent("message", "a"), SSEEvent("message", "b")]
    got.clear()
    with pytest.raises(LineTooLong, match="an event"):
        got.extend(SSEDecoder(max_line_bytes=16).feed(b"data: a\n\n" + b"data: 0123456789\n" * 3))
    assert got == [SSEEvent("message", "a")]


def test_ndjson_decoder_delivers_the_values_before_a_long_line_in_the_same_feed() -> None:
    got: list[object] = []
    with pytest.raises(LineTooLong):
        got.extend(NDJSONDecoder(max_line_bytes=16).feed(b'{"a": 1}\n[2]\n"' + b"x" * 20 + b'"\n'))
    assert got == [{"a": 1}, [2]]
    got.clear()
    with pytest.raises(LineTooLong):  # the unfinished tail is the long one
        got.extend(NDJSONDecoder(max_line_bytes=16).feed(b'{"a": 1}\n"' + b"x" * 20))
    assert got == [{"a": 1}]


def _loads(text: str) -> tuple[str, object]:
    try:
        return "value", json.loads(text)
    except ValueError as exc:
        return "error", str(exc)


def _parsed(text: str) -> tuple[str, object]:
    try:
        return "value", parse_json(text)
    except ValueError as exc:
        return "error", str(exc)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8)


@given(JSON_VALUES, st.sampled_from(["", " ", "\n", "x", ",1", "]"]), st.sampled_from(["", " ", "\t"]))
def test_parse_json_gives_what_json_loads_gives(value, tail, head) -> None:
    # The streamed chunk's fast path: the same value or the same error as json.loads, whatever surrounds it.
    for text in (json.dumps(value), json.dumps(value, separators=(",", ":"), ensure_ascii=False)):
        assert repr(_parsed(head + text + tail)) == repr(_loads(head + text + tail))


@given(st.text(max_size=30))
def test_parse_json_refuses_what_json_loads_refuses(text) -> None:
    assert repr(_parsed(text)) == repr(_loads(text))


# A line's text as a provider sends it: UTF-8, so no lone surrogate (it has no encoding), no line end.
LINE_TEXT = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
                    max_size=20)
SSE_EVENTS = st.lists(st.tuples(st.sampled_from(["", "event: delta\n", "id: 9\n", "retry: 20\n", ": hi\n"]),
                                LINE_TEXT), max_size=8)


@given(SSE_EVENTS, st.sampled_from([16, 1024]))
def test_sse_decoder_one_event_per_feed_gives_what_one_feed_of_all_gives(events, limit) -> None:
    # One event per feed takes the single-line fast path where it can; fed whole, the line decoder.
    parts = [(head + f"data: {text}\n\n").encode() for head, text in events]
    one_by_one: list[object] = []
    with contextlib.suppress(LineTooLong):
        decoder = SSEDecoder(max_line_bytes=limit)
        for part in parts:
            one_by_one.extend(decoder.feed(part))
    whole: list[object] = []
    with contextlib.suppress(LineTooLong):
        whole.extend(SSEDecoder(max_line_bytes=limit).feed(b"".join(parts)))
    assert one_by_one == whole


PLAIN_EVENTS = st.lists(LINE_TEXT, min_size=1, max_size=6)


@given(PLAIN_EVENTS, st.sampled_from(["", "id: 4\n\n", ": hi\n", "data: a\ndata: b\n\n", "data: x\r\n\r\n"]),
       st.sampled_from([8, 16, 1024]))
def test_sse_decoder_a_feed_of_whole_data_events_gives_what_the_line_decoder_gives(texts, before, limit):
    # Fed whole, a run of one-line data events takes the fast path (several events per read: a
    # server that fell behind); fed a byte at a time, never. Both give the same events or fail alike.
    head = before.encode()
    data = b"".join(f"data: {text}\n\n".encode() for text in texts)
    results: list[tuple[list[object], bool]] = []
    for pieces in ([head, data], [bytes([byte]) for byte in head + data]):
        decoder, got, failed = SSEDecoder(max_line_bytes=limit), [], False
        try:
            for piece in pieces:
                got.extend(decoder.feed(piece))
        except LineTooLong:
            failed = True
        results.append((got, failed))
    assert results[0] == results[1]


def test_sse_decoder_several_whole_events_in_one_feed_take_the_fast_path() -> None:
    decoder = SSEDecoder()
    data = b'data: {"a": 1}\n\ndata: \xc3\xa9\n\ndata: [DONE]\n\n'
    assert decoder._plain(data) == [SSEEvent("message", '{"a": 1}'), SSEEvent("message", "é"),
                                    SSEEvent("message", "[DONE]")]
    assert decoder._plain(b"data: a\n\n\n\ndata: b\n\n") is None  # a blank line of its own
    assert decoder._plain(b"data: a\ndata: b\n\n") is None  # two data lines, one event
