"""What every part of the load bench agrees on: the stamped tokens, the request that asks the fake
for a reply, and the few bytes of HTTP/1.1 and WebSocket (RFC 6455) framing the clients speak.

A token is ``~s<seq>:<monotonic ns>~ ``: CLOCK_MONOTONIC is one clock for every process of the
machine, so a client subtracts the stamp from its own arrival time to get the delay of that token
through whatever stood between it and the fake.
"""

from __future__ import annotations

import base64
import json
import os
import re
from typing import Any

STAMP = re.compile(rb"~s(\d+):(\d+)~")
ASK = re.compile(r"tokens=(\d+) rate=(\d+)")
END_OF_CHUNKED = b"\r\n0\r\n\r\n"


def ask(tokens: int, rate: int) -> str:
    """The user message that makes the fake stream ``tokens`` tokens at ``rate`` per second
    (0 = as fast as it can write)."""
    return f"bench tokens={tokens} rate={rate}"


def parse_ask(text: str) -> tuple[int, int]:
    found = ASK.search(text)
    return (int(found[1]), int(found[2])) if found else (20, 0)


def token(seq: int, ns: int) -> str:
    return f"~s{seq}:{ns}~ "


def chat_request(host: str, tokens: int, rate: int) -> bytes:
    body = json.dumps({"model": "m", "stream": True, "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content": ask(tokens, rate)}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def ws_upgrade(host: str, path: str = "/ws") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: meterchat.v1\r\n\r\n").encode()


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked client frame (clients must mask, RFC 6455 section 5.3)."""
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, 0x80 | size])
    elif size < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + size.to_bytes(8, "big")
    repeated = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(size, "big")
    return head + mask + masked


def ws_json(frame: dict[str, Any]) -> bytes:
    return ws_frame(json.dumps(frame).encode())


def ws_frames(buffer: bytearray) -> list[tuple[int, bytes]]:
    """Take every complete server frame (unmasked, unfragmented) off the front of ``buffer``."""
    out: list[tuple[int, bytes]] = []
    while len(buffer) >= 2:
        size, start = buffer[1] & 0x7F, 2
        if size == 126:
            if len(buffer) < 4:
                break
            size, start = int.from_bytes(buffer[2:4], "big"), 4
        elif size == 127:
            if len(buffer) < 10:
                break
            size, start = int.from_bytes(buffer[2:10], "big"), 10
        if len(buffer) < start + size:
            break
        out.append((buffer[0] & 0x0F, bytes(buffer[start:start + size])))
        del buffer[:start + size]
    return out
