"""A provider that streams without end (text, thinking or one tool call's arguments, in each dialect)
costs its own turn a ``reply_too_large`` error and nothing else: the error comes within a deadline,
the reply so far is kept and marked interrupted, the connection to the provider is closed (the fake
sees its client go), the server's memory grows by a bounded amount, a second session keeps streaming
and ``/healthz`` answers. The server runs in its own process (``python -m server``), the way a user
starts it; the providers are the real fakes on loopback.

Before the bound, each of these grew the reply, the frame log and the process without end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.fakes import FakeProvider, Reply
from tests.support import Client, Running, client, run_server, text_of

pytestmark = pytest.mark.anyio

LIMIT = 1 << 20  # max_reply_chars in these tests: 1 MiB, a quarter of the default, to keep them quick
ERROR_WITHIN_S = 10.0  # a deadline on a shared machine; the turn ends well within it
STREAM_PIECES = [f"p{n} " for n in range(40)]
KINDS = ("text", "thinking", "arguments")
ARGUMENT_LIMIT = 256 << 10  # max_tool_argument_chars: one call's arguments end before the reply's bound


def write_config(tmp_path: Path, dialect: str, base_url: str, limit: int | None = LIMIT) -> Path:
    runtime = (f"[runtime]\nmax_reply_chars = {limit}\nmax_tool_argument_chars = {ARGUMENT_LIMIT}\n\n"
               if limit else "")
    path = tmp_path / "meterchat.toml"
    path.write_text(f'[server]\ndata_dir = "{tmp_path / "data"}"\n\n{runtime}[providers.p]\n'
                    f'kind = "{dialect}"\nbase_url = "{base_url}"\nmodel = "m1"\ncontext_window = 32768\n')
    return path


def rss_kib(running: Running, field: str) -> int:
    assert running.process is not None
    for line in Path(f"/proc/{running.process.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc status")


def reset_peak(running: Running) -> None:
    """Linux: writing 5 to clear_refs resets the peak RSS (VmHWM) to the current RSS."""
    assert running.process is not None
    Path(f"/proc/{running.process.pid}/clear_refs").write_text("5")


async def until_done(c: Client, frames: list[dict[str, Any]]) -> None:
    frames += await c.until("done", "error", timeout=30)


async def endless_turn(running: Running, fake: FakeProvider, kind: str
                       ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]], float]:
    """One session streams a slow reply while another's provider streams ``kind`` without end:
    (the endless turn's error, its frames, the other session's frames, seconds to the error)."""
    fake.enqueue(Reply(text=STREAM_PIECES, delay=0.03), Reply(text=["kept "], endless=kind))
    async with client(running.address) as streaming, client(running.address) as endless, \
            httpx.AsyncClient(base_url=running.url, timeout=30) as http:
        await streaming.hello()
        await endless.hello()
        streamed = await streaming.start_turn("stream to me")  # holds the first scripted reply
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(until_done, streaming, streamed)
            await endless.send("message", id="q1", content="never stop")
            sent = time.monotonic()
            with anyio.fail_after(ERROR_WITHIN_S):
                frames = await endless.until("error", "done", timeout=ERROR_WITHIN_S)
                answered_in = time.monotonic() - sent
                assert (await http.get("/healthz")).status_code == 200
        # The session goes on: its next turn is answered (a new connection to the provider).
        again = await endless.say("and now?")
        assert again[-1]["type"] == "done", again[-1]
    async with client(running.address) as reader:
        history = (await reader.hello(endless.session_id))[1]["messages"]
    return frames[-1], frames + [{"type": "history", "messages": history}], streamed, answered_in


def check_bounded(dialect: str, kind: str, error: dict[str, Any], frames: list[dict[str, Any]],
                  streamed: list[dict[str, Any]], fake: FakeProvider) -> None:
    assert error["type"] == "error" and error["code"] == "reply_too_large", error
    assert not error["retryable"] and len(error["message"]) <= 300
    # One call's fragments meet its own bound first; Ollama's whole calls (one a line) the reply's.
    one_call = kind == "arguments" and dialect != "ollama"
    assert ("max_tool_argument_chars" if one_call else "max_reply_chars") in error["message"], error
    # The other session streamed to its end, untouched.
    assert streamed[-1]["type"] == "done" and text_of(streamed) == "".join(STREAM_PIECES)
    # The provider's connection was closed: its endless body ended when the client went.
    assert fake.endless_ended.wait(10), "the provider's stream was never closed"
    shown = text_of(frames) if kind == "text" else "".join(
        f["content"] for f in frames if f["type"] == "thinking")
    assert len(shown) <= LIMIT
    history = frames[-1]["messages"]
    kept = [m for m in history if m["role"] == "assistant"][0]
    assert kept["interrupted"] is True and kept["content"].startswith("kept ")
    assert len(kept["content"]) + len(kept.get("thinking") or "") <= LIMIT
    if kind == "text":
        assert len(kept["content"]) > LIMIT // 2  # the reply so far, not an empty stub
        # The meter shows the next send, the kept reply in it, before the error.
        meter = [f for f in frames if f["type"] == "context"][-1]
        assert meter["reason"] == "done" and meter["estimated_tokens"] > LIMIT // 8
        assert frames.index(meter) < frames.index(error)
    assert not [m for m in history if m["role"] == "tool"]  # the half-streamed call never ran
    assert [m["content"] for m in history if m["role"] == "user"] == ["never stop", "and now?"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dialect", ["openai", "anthropic", "ollama"])
async def test_an_endless_reply_ends_its_turn_with_reply_too_large(
        tmp_path: Path, dialect: str, kind: str, request: pytest.FixtureRequest) -> None:
    fake: FakeProvider = request.getfixturevalue(f"fake_{dialect}")
    with run_server(write_config(tmp_path, dialect, fake.base_url)) as running:
        before = rss_kib(running, "VmRSS")
        reset_peak(running)
        error, frames, streamed, answered_in = await endless_turn(running, fake, kind)
        grown = rss_kib(running, "VmHWM") - before
    print(f"{dialect} endless {kind}: error after {answered_in:.3f} s, "
          f"{fake.endless_bytes_sent >> 10} KiB sent, peak RSS +{grown >> 10} MiB")
    check_bounded(dialect, kind, error, frames, streamed, fake)
    # A few times the bound (the reply's text, its frames on their way out, the decoder's buffers),
    # not the stream: the fake sent far more than this before the socket's buffers filled.
    assert grown < 64 * 1024, f"peak RSS grew by {grown} KiB"


async def test_the_default_bound_holds_with_default_settings(tmp_path: Path,
                                                             fake_openai: FakeProvider) -> None:
    """No [runtime] table: the 4 MiB default ends an endless reply too."""
    with run_server(write_config(tmp_path, "openai", fake_openai.base_url, limit=None)) as running:
        error, frames, streamed, answered_in = await endless_turn(running, fake_openai, "text")
    print(f"openai endless text, default bound: error after {answered_in:.3f} s")
    assert error["code"] == "reply_too_large" and "4,194,304" in error["message"]
    assert 3 << 20 < len(text_of(frames)) <= 4 << 20
    assert fake_openai.endless_ended.wait(10)
