"""A provider that floods the server with an error body (40 MB of one word, 400 MB of a hex dump, an
HTML page that never ends) costs its own turn an ``error`` frame and nothing else: the turn is answered
within a second, a second session keeps streaming, ``/healthz`` answers. The server runs in its own
process (``python -m server``), the way a user starts it; the provider is the real fake on loopback.

Before the fix a 40 MB body of letters held the event loop for over a minute: ``redact`` ran a
quadratic pattern over the 64 KiB head of the body, three times."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fakes import ENDLESS, FakeOpenAI, Reply
from tests.support import Client, client, run_server, text_of

pytestmark = pytest.mark.anyio

ERROR_WITHIN_S = 1.0  # the bound, waited on as a deadline (the turn ends in ~0.1 s)
STREAM_PIECES = [f"p{n} " for n in range(40)]

FLOODS = {
    "40 MB of one word": Reply(status=500, error="x", error_size=40 << 20, error_fill=b"x"),
    "400 MB of hex": Reply(status=500, error="dump", error_size=400 << 20, error_fill=b"0123456789abcdef"),
    "an endless HTML page": Reply(status=502, body="<html><body>", error_size=ENDLESS,
                                  error_fill=b"<p>proxy error: upstream sent garbage</p>\n"),
}


def write_config(tmp_path: Path, base_url: str) -> Path:
    """Default settings but for the store's folder: the provider as a user would configure it."""
    path = tmp_path / "meterchat.toml"
    path.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n\n[providers.p]\nkind = "openai"\n'
                    f'base_url = "{base_url}"\nmodel = "m1"\n')
    return path


async def until_done(c: Client, frames: list[dict[str, Any]]) -> None:
    frames += await c.until("done", "error", timeout=30)


@pytest.mark.parametrize("flood", list(FLOODS), ids=lambda name: name.replace(" ", "-"))
async def test_error_body_flood_costs_only_its_own_turn(tmp_path: Path, fake_openai: FakeOpenAI,
                                                        flood: str) -> None:
    fake_openai.models = {"m1": {"max_model_len": 32768}}
    fake_openai.enqueue(Reply(text=STREAM_PIECES, delay=0.03), FLOODS[flood])
    with run_server(write_config(tmp_path, fake_openai.base_url)) as server:
        async with client(server.address) as streaming, client(server.address) as flooded, \
                httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            await streaming.hello()
            await flooded.hello()
            streamed = await streaming.start_turn("stream to me")  # holds the first scripted reply
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(until_done, streaming, streamed)
                await flooded.send("message", id="q1", content="flood me")
                sent = time.monotonic()
                with anyio.fail_after(ERROR_WITHIN_S):
                    health = await http.get("/healthz")
                    error = (await flooded.until("error", "done"))[-1]
                answered_in = time.monotonic() - sent
                chunks_then = len([f for f in streaming.frames if f["type"] == "chunk"])
    print(f"{flood}: error frame after {answered_in:.3f} s; {fake_openai.error_bytes_sent >> 20} MiB sent")
    assert health.status_code == 200
    assert error["type"] == "error" and error["code"] == "unavailable" and error["retryable"]
    assert error["message"].startswith("p: HTTP 50") and "KiB]" in error["message"]
    assert len(error["message"]) <= 300
    # The other session went on streaming while and after the flood was refused, to its end.
    assert streamed[-1]["type"] == "done" and text_of(streamed) == "".join(STREAM_PIECES)
    assert chunks_then < len(STREAM_PIECES)
    # Only the head was read: the fake stopped once the socket buffers were full.
    assert fake_openai.error_bytes_sent < 32 << 20, fake_openai.error_bytes_sent
