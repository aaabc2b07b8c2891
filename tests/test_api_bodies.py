"""Request bodies are bounded in time and, over every connection at once, in bytes (server/web/api.py):
a client that sends all but the last byte of an import held it for ever, on every connection."""

from __future__ import annotations

import inspect
import select
import socket
import time

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from server.web import api
from server.web.app import create_app
from tests.support import run_server, settings_for


def stalled_import(address: str, declared: int, sent: int) -> socket.socket:
    """A socket whose import request declares ``declared`` body bytes and sends ``sent``."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(f"POST /api/sessions/import HTTP/1.1\r\nHost: {address}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode())
    sock.sendall(b" " * sent)
    return sock


def status(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and (chunk := sock.recv(65536)):
        head += chunk
    return head.split(b"\r\n", 1)[0] + b" " + (b"busy" if b'"busy"' in head else b"")


def test_api_bodies_read_at_once_are_bounded_the_one_past_the_bound_answered_503(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "MAX_READING_BYTES", 1 << 20)
    size = 700 << 10  # two of them pass the 1 MiB bound, each within the import limit
    app = create_app(settings_for(tmp_path, max_import_bytes=800 << 10))
    reading = importer(app).reading
    assert reading.limit == 1 << 20
    with run_server(app) as running, \
            stalled_import(running.address, size, size - 1) as first, \
            stalled_import(running.address, size, size - 1) as second:
        ready, _, _ = select.select([first, second], [], [], 15)  # the refused one is answered now
        assert len(ready) == 1
        refused = ready[0]
        waiting = second if refused is first else first
        assert status(refused) == b"HTTP/1.1 503 Service Unavailable busy"
        waiting.sendall(b" ")  # the other body completes and is judged (spaces are not JSON)
        assert status(waiting).startswith(b"HTTP/1.1 400")
    assert reading.used == 0


def importer(app: Starlette) -> api.SessionsApi:
    """The application's sessions API (the import route's owner, with its ``Reading``)."""
    route = next(r for r in app.routes if isinstance(r, Route) and r.path == "/api/sessions/import")
    assert inspect.ismethod(route.endpoint)
    owner = route.endpoint.__self__
    assert isinstance(owner, api.SessionsApi)
    return owner


def test_api_the_bound_on_bodies_read_at_once_holds_one_whole_import(tmp_path) -> None:
    """An operator who raises ``max_import_bytes`` past the shared bound can still import."""
    assert importer(create_app(settings_for(tmp_path, max_import_bytes=96 << 20))).reading.limit == 96 << 20
    assert importer(create_app(settings_for(tmp_path))).reading.limit == api.MAX_READING_BYTES


def test_api_a_body_that_does_not_arrive_in_time_is_answered_408(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "BODY_SECONDS", 0.5)
    with run_server(create_app(settings_for(tmp_path))) as running, \
            stalled_import(running.address, 1000, 10) as sock:
        started = time.monotonic()
        answer = status(sock)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408")
    assert 0.3 < waited < 5
