"""Faults end in clear answers with nothing lost: SIGTERM mid-reply, a store that refuses writes,
and a database that cannot be opened at start-up."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from server.errors import StoreUnavailable
from server.history.messages import ChatMessage
from server.store.sqlite import FILE_NAME, SqliteStore
from tests.support import REPO, SHORT_REPLY, SLOW_DEMO, client, run_server, serve, settings_for, text_of

pytestmark = pytest.mark.anyio

EXIT_WITHIN_S = 8.0


def write_config(tmp_path: Path, **server: object) -> Path:
    lines = ["[server]", f'data_dir = "{tmp_path / "data"}"']
    lines += [f"{key} = {json.dumps(value)}" for key, value in server.items()]
    lines += ["[providers.demo]", 'kind = "demo"', 'model = "demo-small"', "context_window = 4096",
              "delay_ms = 30"]
    path = tmp_path / "meterchat.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def stored_replies(data_dir: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(data_dir / "meterchat.sqlite3") as db:
        return db.execute("SELECT content, interrupted FROM messages WHERE role = 'assistant'").fetchall()


async def read_events(url: str, lines: list[str], connected: anyio.Event, ended: anyio.Event) -> None:
    async with httpx.AsyncClient() as http, http.stream("GET", f"{url}/events") as response:
        async for line in response.aiter_lines():
            lines.append(line)
            connected.set()  # the stream's first comment: the subscriber is on the bus
    ended.set()


async def test_faults_sigterm_stores_the_streaming_reply_closes_streams_and_exits(tmp_path):
    config = write_config(tmp_path, shutdown_grace_seconds=3.0, store_flush_ms=60000)
    with run_server(config) as running:
        assert running.process is not None
        lines: list[str] = []
        connected, ended = anyio.Event(), anyio.Event()
        async with anyio.create_task_group() as tasks, client(running.address) as c:
            tasks.start_soon(read_events, running.url, lines, connected, ended)
            await c.hello()
            with anyio.fail_after(10):
                await connected.wait()
            frames = await c.start_turn(SHORT_REPLY)
            frames += [await c.recv() for _ in range(3)]
            seen = "".join(f["content"] for f in frames if f["type"] == "chunk")
            running.process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    frames.append(await c.recv())
            with anyio.fail_after(EXIT_WITHIN_S):
                await ended.wait()
        code = await anyio.to_thread.run_sync(running.process.wait, EXIT_WITHIN_S)
        elapsed = time.monotonic() - started
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    # uvicorn re-raises the signal it caught once it has shut down: the exit status says SIGTERM.
    assert code in (0, -signal.SIGTERM) and elapsed < EXIT_WITHIN_S
    assert any("Finished server process" in line for line in running.output)
    assert "aborted" in [f["type"] for f in frames]  # the reply was ended, not cut
    # store_flush_ms is a minute: only the shutdown can have written what the client saw.
    [(content, interrupted)] = stored_replies(tmp_path / "data")
    assert content.startswith(seen) and len(seen) > 0 and interrupted == 1
    assert not [line for line in running.output if "Traceback" in line]


async def test_faults_locked_store_ends_the_turn_with_store_unavailable_and_writes_the_reply_later(tmp_path):
    settings = settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}, "store": {"timeout_seconds": 0.1}},
                            store_flush_ms=50)
    database = tmp_path / "data" / "meterchat.sqlite3"
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            frames = await c.start_turn("echo " + " ".join(f"w{n}" for n in range(200)))
            with another_writer(database):  # another writer holds the lock past store.timeout_seconds
                frames += await c.until("error")
                error = frames[-1]
                assert error["code"] == "store_unavailable" and error["retryable"] is True
                assert frames[0]["type"] == "accepted" and error["turn_id"] == frames[0]["turn_id"]
                seen = text_of(frames)
                refused = await c.say("echo while locked", id="locked")  # nothing stored, draft kept
                assert refused[-1]["code"] == "store_unavailable" and refused[-1]["message_id"] == "locked"
            notice = (await c.until("notice"))[-1]
            assert notice["code"] == "store_recovered"
            # The reply was complete, only its write waited: it is stored whole, not interrupted, and
            # the call's record waited with it (written in its transaction), not lost.
            [(content, interrupted)] = stored_replies(tmp_path / "data")
            assert content == seen and interrupted == 0
            assert stored_calls(tmp_path / "data") == [error["turn_id"]]
            after = await c.say("echo after")  # the session goes on
    assert after[-1]["type"] == "done"


def stored_calls(data_dir: Path) -> list[str]:
    with sqlite3.connect(data_dir / "meterchat.sqlite3") as db:
        return [row[0] for row in db.execute("SELECT turn_id FROM calls ORDER BY seq")]


@contextmanager
def another_writer(database: Path) -> Iterator[None]:
    """Another connection holds the database's write lock while the block runs."""
    locker = sqlite3.connect(database, isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        locker.execute("ROLLBACK")
        locker.close()


def stored_messages(data_dir: Path) -> list[tuple[str, str, int]]:
    """(role, content, interrupted) of every stored message, in the session's order."""
    with sqlite3.connect(data_dir / "meterchat.sqlite3") as db:
        return db.execute("SELECT role, content, interrupted FROM messages ORDER BY position").fetchall()


async def test_faults_the_reply_streams_while_the_store_is_busy_and_done_waits_for_the_message(tmp_path):
    """The user's message is written beside the provider call: a store busy with another writer
    holds neither the first chunk nor the flushes' order, and ``done`` comes once it is stored."""
    settings = settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}, "store": {"timeout_seconds": 30}},
                            store_flush_ms=20)
    data = tmp_path / "data"
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("echo first")
            with another_writer(data / "meterchat.sqlite3"):
                frames = await c.start_turn("echo " + " ".join(f"w{n}" for n in range(30)), message_id="busy")
                frames += [await c.recv() for _ in range(5)]  # flushes fall due while the store is busy
                assert [m[1] for m in stored_messages(data)] == ["echo first", "first"]
            frames += await c.until("done", "error")
    assert frames[-1]["type"] == "done"
    reply = text_of(frames)
    assert stored_messages(data) == [("user", "echo first", 0), ("assistant", "first", 0),
                                     ("user", frames[0]["content"], 0), ("assistant", reply, 0)]


async def test_faults_a_refused_user_message_ends_the_turn_with_store_unavailable_and_is_kept(tmp_path):
    settings = settings_for(tmp_path, {"providers": {"demo": SLOW_DEMO}, "store": {"timeout_seconds": 0.1}})
    data = tmp_path / "data"
    with serve(settings) as address:
        async with client(address) as c:
            await c.hello()
            await c.say("echo first")
            # Past store.timeout_seconds: every write is refused.
            with another_writer(data / "meterchat.sqlite3"):
                frames = await c.say("echo refused at first")
                error = frames[-1]
                assert error["code"] == "store_unavailable" and error["turn_id"] == frames[0]["turn_id"]
                assert frames[0]["type"] == "accepted"
            notice = (await c.until("notice"))[-1]
            assert notice["code"] == "store_recovered"
            after = await c.say("echo after")
    assert after[-1]["type"] == "done"
    roles = [(role, content) for role, content, _ in stored_messages(data)]
    assert roles[:3] == [("user", "echo first"), ("assistant", "first"), ("user", "echo refused at first")]
    assert roles[-2:] == [("user", "echo after"), ("assistant", "after")]


async def test_faults_full_store_raises_store_unavailable_and_takes_the_write_once_space_is_back(tmp_path):
    store = SqliteStore.open(tmp_path)
    await store.create_session("s1", title="t", route="demo/demo-small")
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    big = ChatMessage("assistant", "x" * 200_000, id="m1")
    with pytest.raises(StoreUnavailable, match="full"):
        await store.save_messages("s1", [big])
    store._conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
    await store.save_messages("s1", [big])
    stored = await store.get_session("s1")
    await store.close()
    assert stored is not None and stored.messages[0].content == big.content


def start_on(data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "meterchat.toml"
    config.write_text(f'[server]\ndata_dir = "{data_dir}"\n')
    return subprocess.run([sys.executable, "-m", "server", "--config", str(config), "--port", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def garbage(data: Path) -> None:
    (data / FILE_NAME).write_bytes(b"this is not a database, " * 400)


def damaged_page(data: Path) -> None:
    path = data / FILE_NAME
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE filler (x TEXT)")
        db.executemany("INSERT INTO filler VALUES (?)", [("y" * 500,) for _ in range(200)])
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode = DELETE")  # everything in the main file, none in a WAL
    raw = bytearray(path.read_bytes())
    page = 4096
    raw[page * 2: page * 2 + 64] = b"\xff" * 64  # a b-tree page header of the filler table
    path.write_bytes(bytes(raw))


def not_a_file(data: Path) -> None:
    (data / FILE_NAME).mkdir()  # cannot be opened as a file (root reads any file: a mode would not do)


def wal_blocked(data: Path) -> None:
    sqlite3.connect(data / FILE_NAME).close()
    (data / f"{FILE_NAME}-wal").mkdir()  # the write-ahead log cannot be created: no write can happen


def read_only_file(data: Path) -> None:
    path = data / FILE_NAME
    sqlite3.connect(path).close()
    path.chmod(0o444)
    data.chmod(0o555)


def unreadable_file(data: Path) -> None:
    path = data / FILE_NAME
    sqlite3.connect(path).close()
    path.chmod(0)


AS_ROOT = os.geteuid() == 0
NOT_AS_ROOT = pytest.mark.skipif(AS_ROOT, reason="root reads and writes any file whatever its mode")


@pytest.mark.parametrize("spoil, problem", [
    (garbage, "not a database"),
    (damaged_page, "corrupt"),
    (not_a_file, "cannot open"),
    (wal_blocked, "cannot be used"),
    pytest.param(read_only_file, "cannot be used", marks=NOT_AS_ROOT),
    pytest.param(unreadable_file, "cannot", marks=NOT_AS_ROOT),
])
def test_faults_unusable_database_stops_start_up_with_one_line(tmp_path, spoil, problem):
    data = tmp_path / "data"
    data.mkdir()
    spoil(data)
    try:
        result = start_on(data, tmp_path)
    finally:
        data.chmod(0o755)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0
    assert len(lines) == 1, result.stderr
    assert str(data / FILE_NAME) in lines[0] and problem in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
