"""Parsing client frames (server/protocol.py): whatever the text, the answer is a valid frame or a
``BadFrame`` / ``UnknownFrameType`` whose message is short, valid text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.errors import BadFrame, ClientError, UnknownFrameType
from server.protocol import ECHO_CHARS, ID_CHARS, echo, parse_client_frame, valid_text

MESSAGE_BOUND = 2 * ECHO_CHARS + 200  # two echoed values and the sentence around them


def refused(text: str) -> ClientError:
    with pytest.raises(ClientError) as caught:
        parse_client_frame(text)
    message = caught.value.message
    message.encode("utf-8")  # would raise on a lone surrogate
    assert len(message) <= MESSAGE_BOUND
    return caught.value


def every_string(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in every_string(k) + every_string(v)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in every_string(item)]
    return every_string(vars(value)) if hasattr(value, "__dataclass_fields__") else []


@pytest.mark.parametrize("depth", [1000, 100_000])
def test_protocol_deep_nesting_is_a_bad_frame(depth):
    assert isinstance(refused("[" * depth + "]" * depth), BadFrame)
    inner = '{"type": "message", "id": "a", "content": "x", "extra": ' + "[" * depth + "]" * depth + "}"
    try:
        frame = parse_client_frame(inner)
    except BadFrame:
        return
    assert "extra" not in frame.fields  # parsed (within the limit): unknown fields are not kept


def test_protocol_huge_numbers_are_bad_frames():
    assert "too long" in refused('{"type": "hello", "last_seq": ' + "9" * 5000 + "}").message
    assert isinstance(refused('{"type": "hello", "last_seq": 1e999}'), BadFrame)
    assert isinstance(refused('{"type": "hello", "last_seq": NaN}'), BadFrame)
    assert isinstance(refused('{"type": "hello", "last_seq": -1}'), BadFrame)
    assert isinstance(refused('{"type": "hello", "last_seq": 9007199254740992}'), BadFrame)
    assert parse_client_frame('{"type": "hello", "last_seq": 9007199254740991}').get("last_seq") == 2**53 - 1


def test_protocol_lone_surrogates_become_replacement_characters_in_text():
    frame = parse_client_frame('{"type": "message", "id": "m1", "content": "a\\ud800b\\udfff"}')
    assert frame.get("content") == "a\ufffdb\ufffd"
    paired = parse_client_frame('{"type": "message", "id": "m1", "content": "\\ud83d\\ude00"}')
    assert paired.get("content") == "\U0001F600"  # a correct pair is one character, untouched
    route = parse_client_frame('{"type": "switch_model", "route": "demo/\\udc00"}')
    assert route.get("route") == "demo/\ufffd"
    image = parse_client_frame('{"type": "message", "id": "m", "content": "", '
                               '"images": [{"media_type": "image/\\ud800", "data": "QQ=="}]}')
    assert image.get("images")[0].media_type == "image/\ufffd"


def test_protocol_lone_surrogates_in_ids_are_refused_clearly():
    for text in ('{"type": "hello", "session_id": "\\ud800"}',
                 '{"type": "message", "id": "\\ud800", "content": "x"}',
                 '{"type": "message", "id": "m", "content": "x", "retry_of": "t\\udfff"}'):
        assert "lone surrogate" in refused(text).message


def test_protocol_lone_surrogate_in_type_is_echoed_as_valid_text():
    error = refused('{"type": "\\ud800"}')
    assert isinstance(error, UnknownFrameType) and "\\ud800" in error.message


@pytest.mark.parametrize("text", ["[]", "1", '"hello"', "null", "true", '{"type": 1}', "{}", "",
                                  '{"type": "hello"', b'{"type": "hello"}'])
def test_protocol_non_object_frames_are_bad_frames(text):
    assert isinstance(refused(text), BadFrame)


WRONG_FIELDS = [
    {"type": "hello", "session_id": 5}, {"type": "hello", "session_id": ["a"]},
    {"type": "hello", "last_seq": "3"}, {"type": "hello", "last_seq": True},
    {"type": "hello", "last_seq": 1.5},
    {"type": "message"}, {"type": "message", "id": "m"}, {"type": "message", "content": "x"},
    {"type": "message", "id": 1, "content": "x"}, {"type": "message", "id": "", "content": "x"},
    {"type": "message", "id": "m" * (ID_CHARS + 1), "content": "x"},
    {"type": "message", "id": "m", "content": None}, {"type": "message", "id": "m", "content": "  "},
    {"type": "message", "id": "m", "content": "x", "images": "png"},
    {"type": "message", "id": "m", "content": "x", "images": [1]},
    {"type": "message", "id": "m", "content": "x", "images": [{"media_type": "x" * 101, "data": ""}]},
    {"type": "message", "id": "m", "content": "x", "retry_of": 7},
    {"type": "switch_model"}, {"type": "switch_model", "route": {"a": 1}},
    {"type": "switch_model", "route": "r" * 201},
    {"type": "message", "id": "m", "content": "/model demo/" + "r" * 200},
    {"type": "message", "id": "m", "content": "/model demo " + "r " * 100},
    {"type": "message", "id": "m", "content": "/hint " + "h" * 201 + " hello"},
]


@pytest.mark.parametrize("frame", WRONG_FIELDS, ids=lambda f: json.dumps(f)[:60])
def test_protocol_wrong_field_types_are_bad_frames(frame):
    assert isinstance(refused(json.dumps(frame)), BadFrame)


def test_protocol_echoed_values_are_cut():
    error = refused(json.dumps({"type": "x" * 1_000_000}))
    assert len(error.message) < 400 and "..." in error.message
    assert refused(json.dumps({"type": "message", "id": "m", "content": ["y" * 10**6]})).message.endswith(
        "got an array")
    assert len(echo("z" * 10**6)) <= ECHO_CHARS + 3
    assert len(echo("\x00" * ECHO_CHARS)) <= ECHO_CHARS + 3  # each escaped as four characters
    assert echo("short") == "'short'" and echo(["a"]) == "an array"


def test_protocol_commands_of_ordinary_length_pass():
    for content in ("/model demo/demo-open", "/hint fast tell me", "/hint " + "h" * 200,
                    "/modelling " + "x" * 500):
        assert parse_client_frame(json.dumps({"type": "message", "id": "m", "content": content}))


def test_protocol_unknown_fields_are_dropped():
    frame = parse_client_frame('{"type": "stop", "\\ud800": 1, "type2": "x"}')
    assert frame.type == "stop" and frame.fields == {}


def test_protocol_empty_session_id_asks_for_a_new_session():
    assert parse_client_frame('{"type": "hello", "session_id": ""}').get("session_id") == ""


def test_protocol_valid_text_only_changes_lone_surrogates():
    assert valid_text("plain \U0001F600 text") == "plain \U0001F600 text"
    assert valid_text("\ud83d\ude00") == "\ufffd\ufffd"  # in a Python str a split pair is two lone halves


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
                 st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                              lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner))
                 .map(lambda v: json.dumps({"type": "message", "id": "m", "content": v}))))
def test_protocol_any_text_is_a_frame_or_a_short_client_error(text):
    try:
        frame = parse_client_frame(text)
    except ClientError as exc:
        exc.message.encode("utf-8")
        assert len(exc.message) <= MESSAGE_BOUND
        return
    for value in every_string(frame.fields):
        value.encode("utf-8")
