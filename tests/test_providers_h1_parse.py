"""h11 and the httptools reader (``server/providers/h1_parse.py``) agree on the same responses cut at
random places: status, reason, version, header fields in order, every body byte, keep-alive, and
whether the message was complete; for content-length, chunked (with extensions and trailers) and
close-delimited bodies, HTTP/1.0 and 1.1."""

from __future__ import annotations

from typing import Any

import h11
import httpcore
from hypothesis import given, settings
from hypothesis import strategies as st

from server.providers.h1_parse import ResponseReader

TOKEN = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1,
                max_size=12).map(str.encode)
VALUE = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30).map(
    str.encode)
RESERVED = {b"content-length", b"transfer-encoding", b"connection"}


@st.composite
def responses(draw: Any) -> tuple[bytes, bool]:
    """A response's bytes, and whether it ends only at end of file (close-delimited)."""
    version = draw(st.sampled_from([b"1.1", b"1.1", b"1.0"]))
    status = draw(st.sampled_from([200, 201, 400, 404, 429, 500, 503]))
    reason = draw(st.sampled_from([b"OK", b"Not Found", b"Whatever it says", b""]))
    fields = [(name, value) for name, value in draw(st.lists(st.tuples(TOKEN, VALUE), max_size=6))
              if name.lower() not in RESERVED]
    body = draw(st.binary(max_size=600))
    framing = draw(st.sampled_from(["length", "chunked", "close"] if version == b"1.1" else
                                   ["length", "close"]))
    if draw(st.booleans()):
        fields.append((b"Connection", draw(st.sampled_from([b"close", b"keep-alive"]))))
    payload = body
    if framing == "length":
        fields.append((b"Content-Length", str(len(body)).encode()))
    elif framing == "chunked":
        fields.append((b"Transfer-Encoding", b"chunked"))
        payload = chunked(body, draw(st.lists(st.integers(1, 200), min_size=1, max_size=8)),
                          draw(st.booleans()), draw(st.booleans()))
    head = b"HTTP/" + version + b" %d " % status + reason + b"\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in fields) + b"\r\n"
    return head + payload, framing == "close"


def chunked(body: bytes, sizes: list[int], extension: bool, trailer: bool) -> bytes:
    out, at, n = [], 0, 0
    while at < len(body):
        size = sizes[n % len(sizes)]
        piece, at, n = body[at:at + size], at + size, n + 1
        out.append(b"%x%s\r\n%s\r\n" % (len(piece), b";a=b" if extension else b"", piece))
    out.append(b"0\r\n" + (b"X-Trailer: yes\r\n" if trailer else b"") + b"\r\n")
    return b"".join(out)


def cut(data: bytes, points: list[int]) -> list[bytes]:
    marks = sorted({0, len(data), *(p % (len(data) + 1) for p in points)})
    return [data[a:b] for a, b in zip(marks, marks[1:], strict=False)]


def by_h11(pieces: list[bytes], eof: bool) -> dict[str, Any]:
    connection = h11.Connection(our_role=h11.CLIENT)
    connection.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    connection.send(h11.EndOfMessage())
    seen: dict[str, Any] = {"body": b"", "done": False}
    for piece in [*pieces, *([b""] if eof else [])]:
        connection.receive_data(piece)
        while (event := connection.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(event, h11.Response):
                seen.update(status=event.status_code, reason=event.reason,
                            version=b"HTTP/" + event.http_version, headers=event.headers.raw_items())
            elif isinstance(event, h11.Data):
                seen["body"] += event.data
            elif isinstance(event, h11.EndOfMessage):
                seen["done"] = True
            elif isinstance(event, h11.ConnectionClosed):
                break
    seen["keep_alive"] = seen["done"] and connection.their_state is h11.DONE \
        and connection.our_state is h11.DONE and not eof
    return seen


def by_httptools(pieces: list[bytes], eof: bool) -> dict[str, Any]:
    reader = ResponseReader()
    reader.expect(head_only=False)
    for piece in pieces:
        reader.data_received(piece)
    if eof:
        reader.eof_received()
    assert reader.failure is None, reader.failure
    return {"status": reader.status, "reason": reader.reason, "version": reader.http_version,
            "headers": reader.headers, "body": b"".join(reader.body), "done": reader.done,
            "keep_alive": reader.reusable()}


@settings(max_examples=400, deadline=None)
@given(responses(), st.lists(st.integers(0, 10_000), max_size=12))
def test_h11_and_httptools_agree_on_every_cut(response: tuple[bytes, bool], points: list[int]):
    data, until_eof = response
    pieces = cut(data, points)
    expected = by_h11(pieces, eof=until_eof)
    got = by_httptools(pieces, eof=until_eof)
    if until_eof:  # h11 keeps no keep-alive state for a close-delimited body; neither may reuse it
        assert not got["keep_alive"]
        expected["keep_alive"] = got["keep_alive"]
    assert got == expected


@given(responses(), st.lists(st.integers(0, 10_000), max_size=6), st.integers(1, 50))
def test_a_response_cut_before_its_end_is_an_error_unless_close_delimited(
        response: tuple[bytes, bool], points: list[int], short: int):
    data, until_eof = response
    if until_eof:
        return
    reader = ResponseReader()
    reader.expect(head_only=False)
    for piece in cut(data[:-short] if short < len(data) else data[:1], points):
        reader.data_received(piece)
    reader.eof_received()
    assert not reader.done
    assert isinstance(reader.failure, httpcore.RemoteProtocolError)
