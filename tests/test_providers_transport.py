"""The provider transport: httpx's pool over ``LeanBackend`` (asyncio protocols), against real
servers on loopback: plain and TLS, streamed bodies, keep-alive, timeouts, a peer that goes away."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpcore
import httpx
import pytest

from server.config.settings import ProviderProfile
from server.providers._http import build_client
from server.providers.pool import FastPool
from server.providers.transport import LeanBackend, build_transport
from tests.support import run_server

pytestmark = pytest.mark.anyio
LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=10)


def app(clients: list[Any]) -> Any:
    """Streams ``?parts=N`` pieces of 10 bytes, or stalls after its head with ``?stall=1``."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        clients.append(scope["client"])
        query = dict(part.split("=") for part in scope["query_string"].decode().split("&") if part)
        head = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        if query.get("stall"):
            await anyio.sleep_forever()
        for n in range(int(query.get("parts", "3"))):
            await send({"type": "http.response.body", "body": f"part {n:04d}\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return asgi


def lean_client(ssl_context: Any = None, read: float = 5.0) -> httpx.AsyncClient:
    pool = httpcore.AsyncConnectionPool(ssl_context=ssl_context, network_backend=LeanBackend())
    transport = httpx.AsyncHTTPTransport(limits=LIMITS)
    transport._pool = pool
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(read, connect=5.0))


async def streamed(http: httpx.AsyncClient, url: str) -> bytes:
    async with http.stream("GET", url) as response:
        return b"".join([part async for part in response.aiter_raw()])


async def test_streams_through_the_lean_backend_and_keeps_the_connection():
    clients: list[Any] = []
    with run_server(app(clients)) as running:
        async with lean_client() as http:
            first = await streamed(http, f"{running.url}/?parts=50")
            second = await streamed(http, f"{running.url}/?parts=2")
    assert first == b"".join(f"part {n:04d}\n".encode() for n in range(50))
    assert second == b"part 0000\npart 0001\n"
    assert len({tuple(client) for client in clients}) == 1  # one TCP connection, kept alive


async def test_the_provider_client_reads_through_the_fast_pool(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    clients: list[Any] = []
    with run_server(app(clients)) as running:
        client = build_client(ProviderProfile(alias="p", kind="openai", base_url=running.url))
        async with client:
            assert await streamed(client, f"{running.url}/?parts=1") == b"part 0000\n"
            assert isinstance(client._transport, httpx.AsyncHTTPTransport)
            assert isinstance(client._transport._pool, FastPool)


async def test_a_proxy_in_the_environment_keeps_httpx_default_transport(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert build_transport(LIMITS) is not None  # NO_PROXY alone configures no proxy
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    assert build_transport(LIMITS) is None


async def test_silence_after_the_head_is_a_read_timeout():
    with run_server(app([])) as running:
        async with lean_client(read=0.2) as http:
            with pytest.raises(httpx.ReadTimeout):
                await streamed(http, f"{running.url}/?stall=1")


async def test_a_refused_connection_is_a_connect_error():
    with run_server(app([])) as running:
        url = running.url
    async with lean_client() as http:
        with pytest.raises(httpx.ConnectError):
            await streamed(http, f"{url}/")


async def test_a_peer_that_closes_mid_body_is_an_error():
    async def serve_half(stream: Any) -> None:
        async with stream:
            await stream.receive()
            await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, serve_half)
        async with lean_client() as http:
            with pytest.raises(httpx.RemoteProtocolError):
                await streamed(http, f"http://127.0.0.1:{port}/")
        tasks.cancel_scope.cancel()


async def test_tls_through_the_lean_backend(tmp_path: Path):
    import ssl

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    context = ssl.create_default_context(cafile=str(cert))
    clients: list[Any] = []
    with run_server(app(clients), ssl_certfile=str(cert), ssl_keyfile=str(key)) as running:
        url = running.url.replace("http://", "https://")
        async with lean_client(context) as http:
            assert await streamed(http, f"{url}/?parts=20") == \
                b"".join(f"part {n:04d}\n".encode() for n in range(20))
            assert await streamed(http, f"{url}/?parts=1") == b"part 0000\n"
    assert len({tuple(client) for client in clients}) == 1
