"""The bounded stdio reader (pure: bytes in, messages out): lines split anywhere, a line over the
bound dropped as it comes and answered with an error for the request it carried."""

from __future__ import annotations

import json

import mcp_types as types
from mcp.shared.message import SessionMessage

from server.tools.stdio import BoundedLines, LineTooLong


def reply(request_id: int | str, text: str, id_last: bool = False) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "result": {"content": [{"type": "text", "text": text}]}}
    if id_last:  # the TypeScript SDK writes {result, jsonrpc, id}
        body = {"result": body["result"], "jsonrpc": "2.0", "id": request_id}
    return json.dumps(body).encode() + b"\n"


def feed(lines: BoundedLines, data: bytes, step: int) -> list[SessionMessage | Exception]:
    out: list[SessionMessage | Exception] = []
    for start in range(0, len(data), step):
        out += lines.feed(data[start:start + step])
    return out


def test_lines_split_anywhere_come_out_whole():
    data = reply(1, "héllo") + b"\n" + reply(2, "x" * 100)
    for step in (1, 7, len(data)):
        out = feed(BoundedLines(1000), data, step)
        assert [m.message.id for m in out if isinstance(m, SessionMessage)] == [1, 2]


def test_a_flood_is_dropped_and_its_request_answered_with_an_error():
    for request_id, id_last in ((7, False), ("abc", True)):
        lines = BoundedLines(500)
        out = feed(lines, reply(request_id, "y" * 100_000, id_last) + reply(8, "after"), 4096)
        error, after = out
        assert isinstance(error, SessionMessage) and isinstance(error.message, types.JSONRPCError)
        assert error.message.id == request_id and "over max_result_bytes (500)" in error.message.error.message
        assert isinstance(after, SessionMessage) and after.message.id == 8
        assert len(lines.buffer) == 0 and len(lines.tail) <= 256  # nothing of the flood is kept


def test_a_flood_without_an_id_and_garbage_are_errors_not_crashes():
    out = BoundedLines(10).feed(b'{"x": "' + b"z" * 50 + b'"}\nnot json\n')
    assert isinstance(out[0], LineTooLong) and isinstance(out[1], ValueError)
