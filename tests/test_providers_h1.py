"""The C-parsed HTTP/1.1 path (``server/providers/h1.py``) under httpx's client, against real servers
on loopback: uvicorn for plain and TLS streams, raw TCP servers for the framings and the failures
(content-length, chunked, close-delimited, cut bodies, oversized heads and trailers, timeouts)."""

from __future__ import annotations

import asyncio
import math
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpcore
import httpx
import pytest
from httpcore._async.connection_pool import AsyncPoolRequest

from server.providers.h1 import BODY, REQUEST_SENT, H1Body, H1Connection
from server.providers.h1_parse import MAX_OVERHEAD
from server.providers.pool import FastPool
from server.providers.transport import build_transport
from tests.support import run_server

pytestmark = pytest.mark.anyio
Reply = Callable[[anyio.abc.SocketStream], Awaitable[None]]


def fast_client(ssl_context: Any = None, read: float = 5.0, connections: int = 10,
                pool: float = 5.0) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport()
    transport._pool = FastPool(ssl_context=ssl_context, max_connections=connections,
                               max_keepalive_connections=connections)
    return httpx.AsyncClient(transport=transport,
                             timeout=httpx.Timeout(read, connect=1.0, pool=pool))


def parts_app(clients: list[Any]) -> Any:
    """Streams ``?parts=N`` pieces of 10 bytes (chunked), or stalls after its head with ``?stall=1``."""
    async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        clients.append(tuple(scope["client"]))
        query = dict(part.split("=") for part in scope["query_string"].decode().split("&") if part)
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"x-echo", str(len(body)).encode())]})
        if query.get("stall"):
            await anyio.sleep_forever()
        for n in range(int(query.get("parts", "3"))):
            await send({"type": "http.response.body", "body": f"part {n:04d}\n".encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    return asgi


def parts(n: int) -> bytes:
    return b"".join(f"part {i:04d}\n".encode() for i in range(n))


async def streamed(http: httpx.AsyncClient, url: str, method: str = "GET", **kwargs: Any) -> bytes:
    async with http.stream(method, url, **kwargs) as response:
        return b"".join([part async for part in response.aiter_raw()])


@asynccontextmanager
async def raw_server(reply: Reply) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on loopback answering each connection with ``reply``; yields its URL and a list
    that counts the connections it accepted."""
    accepted: list[int] = []

    async def handle(stream: anyio.abc.SocketStream) -> None:
        accepted.append(1)
        async with stream:
            try:
                await reply(stream)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as tasks:
        tasks.start_soon(listener.serve, handle)
        yield f"http://127.0.0.1:{port}", accepted
        tasks.cancel_scope.cancel()


async def read_request(stream: anyio.abc.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive()
    return data


def answering(*responses: bytes) -> Reply:
    """A connection that answers its requests with ``responses`` in turn, then closes."""
    async def reply(stream: anyio.abc.SocketStream) -> None:
        for response in responses:
            await read_request(stream)
            await stream.send(response)
    return reply


async def test_streams_chunked_replies_and_keeps_the_connection_alive():
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        async with fast_client() as http:
            first = await streamed(http, f"{running.url}/?parts=500")
            async with http.stream("POST", f"{running.url}/?parts=2", json={"a": "b" * 1000}) as response:
                second = b"".join([part async for part in response.aiter_raw()])
                echoed = response.headers["x-echo"]
            pool = http._transport._pool  # type: ignore[attr-defined]
            assert all(isinstance(conn, H1Connection) for conn in pool.connections)
    assert first == parts(500)
    assert second == parts(2) and echoed == "1008"  # {"a":"bbb...b"}, sent with Content-Length
    assert len(set(clients)) == 1  # one TCP connection for both requests


async def test_a_streamed_request_body_is_sent_chunked():
    async def pieces() -> AsyncIterator[bytes]:
        for n in range(3):
            yield b"x" * (n + 1) * 40000

    with run_server(parts_app([])) as running:
        async with fast_client() as http:
            response = await http.post(f"{running.url}/?parts=1", content=pieces())
    assert response.headers["x-echo"] == str(6 * 40000) and response.content == parts(1)


async def test_the_trace_extension_says_when_the_request_left_before_its_answer_is_read():
    """``REQUEST_SENT`` fires once the request is written, before the answer is read (the server
    answers only after it), on this path and on httpx's own h11 path alike."""
    answers: list[anyio.Event] = []

    async def reply(stream: anyio.abc.SocketStream) -> None:
        data = await read_request(stream)
        while len(data.split(b"\r\n\r\n", 1)[1]) < 1000:
            data += await stream.receive()
        await answers[-1].wait()
        await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    async def trace(event: str, info: Any) -> None:
        seen.append(event)
        if event == REQUEST_SENT:
            answers[-1].set()

    bodies = []
    async with raw_server(reply) as (url, _):
        for http in (fast_client(), httpx.AsyncClient(timeout=5.0)):
            seen: list[str] = []
            answers.append(anyio.Event())
            async with http:
                with anyio.fail_after(5):
                    bodies.append(await streamed(http, url, "POST", content=b"x" * 1000,
                                                 extensions={"trace": trace}))
            assert seen.count(REQUEST_SENT) == 1
    assert bodies == [b"ok", b"ok"]


async def test_the_provider_transport_is_the_fast_pool(monkeypatch):
    for name in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    transport = build_transport(httpx.Limits(max_connections=3))
    assert transport is not None and isinstance(transport._pool, FastPool)
    await transport.aclose()


async def test_content_length_and_close_delimited_bodies():
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
    until_close = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
    async with raw_server(answering(sized, sized, until_close)) as (url, accepted):
        async with fast_client() as http:
            assert await streamed(http, url) == b"hello"
            assert await streamed(http, url) == b"hello"
            assert await streamed(http, url) == b"until the end"
            assert (await http.get(url)).content == b"hello"  # the closed connection is not reused
    assert len(accepted) == 2


async def test_an_answer_before_the_whole_request_body_is_read():
    async def refuse(stream: anyio.abc.SocketStream) -> None:
        await read_request(stream)
        await stream.send(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\n"
                          b"too big!")

    async with raw_server(refuse) as (url, _):
        async with fast_client() as http:
            response = await http.post(url, content=b"x" * (32 << 20))
    assert response.status_code == 413 and response.content == b"too big!"


async def test_a_head_request_reads_no_body_and_interim_responses_are_skipped():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(answering(head, interim)) as (url, accepted):
        async with fast_client() as http:
            response = await http.head(url)
            assert response.status_code == 200 and response.content == b""
            assert response.headers["content-length"] == "5"
            assert (await http.get(url)).content == b"ok"
    assert len(accepted) == 1


async def test_a_chunked_body_with_extensions_and_trailers():
    body = b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body
    async with raw_server(answering(response, response)) as (url, accepted):
        async with fast_client() as http:
            first = await http.get(url)
            second = await http.get(url)
    assert first.content == second.content == b"hello world"
    assert "x-trailer" not in first.headers
    assert len(accepted) == 1


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nonly ten b",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
])
async def test_a_body_cut_short_is_a_remote_protocol_error(response: bytes):
    async with raw_server(answering(response)) as (url, _):
        async with fast_client() as http:
            with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                await streamed(http, url)


@pytest.mark.parametrize("response, match", [
    (b"", "without sending a response"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "middle of the response head"),
    (b"HTTP/1.1 abc\r\n\r\n", "malformed"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx", "malformed"),
])
async def test_a_broken_head_is_a_remote_protocol_error(response: bytes, match: str):
    async with raw_server(answering(response)) as (url, _):
        async with fast_client() as http:
            with pytest.raises(httpx.RemoteProtocolError, match=match):
                await streamed(http, url)


def endless(head: bytes, filler: bytes) -> Reply:
    """Sends ``head``, then ``filler`` over and over until the client goes away."""
    async def reply(stream: anyio.abc.SocketStream) -> None:
        await read_request(stream)
        await stream.send(head)
        while True:
            await stream.send(filler)
    return reply


@pytest.mark.parametrize("head, filler, match", [
    (b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 4096, "response head larger"),
    (b"HTTP/1.1 200 OK\r\n", b"X-Many: header\r\n" * 256, "response head larger"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: ", b"t" * 4096,
     "chunk header or trailer larger"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=", b"e" * 4096,
     "chunk header or trailer larger"),
])
async def test_endless_heads_and_trailers_are_cut_at_the_bound(head: bytes, filler: bytes, match: str):
    async with raw_server(endless(head, filler)) as (url, _):
        async with fast_client() as http:
            with pytest.raises(httpx.RemoteProtocolError, match=match):
                await streamed(http, url)
    assert MAX_OVERHEAD == 100 * 1024


async def test_silence_after_the_head_is_a_read_timeout_and_the_connection_is_dropped():
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        async with fast_client(read=0.2) as http:
            with pytest.raises(httpx.ReadTimeout):
                await streamed(http, f"{running.url}/?stall=1")
            assert await streamed(http, f"{running.url}/?parts=1") == parts(1)
    assert len(set(clients)) == 2


async def test_the_read_timeout_bounds_each_wait_not_the_whole_body():
    # One timer per connection, moved as each wait begins: a body paced faster than the timeout
    # runs past it in all, then silence times out one timeout after the last piece.
    async def paced(stream: anyio.abc.SocketStream) -> None:
        await read_request(stream)
        await stream.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for n in range(8):
            await anyio.sleep(0.06)  # the pace is the subject: 8 x 0.06 s outlasts the 0.2 s timeout
            await stream.send(b"a\r\n" + f"part {n:04d}\n".encode() + b"\r\n")
        await anyio.sleep_forever()

    got: list[bytes] = []
    async with raw_server(paced) as (url, _), fast_client(read=0.2) as http:
        began = time.monotonic()
        with anyio.fail_after(5), pytest.raises(httpx.ReadTimeout):  # a timer never re-armed: no hang
            async with http.stream("GET", url) as response:
                async for part in response.aiter_raw():
                    got.append(part)
                    last = time.monotonic()
        ended = time.monotonic()
    assert b"".join(got) == parts(8) and last - began > 0.4 and ended - last >= 0.19


async def test_the_body_read_past_httpx_wrappers_is_the_same_body_with_httpx_errors():
    # _http.py reads a provider's body through H1Body.parts (named in the response's extensions).
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        async with fast_client(read=0.2) as http:
            async with http.stream("GET", f"{running.url}/?parts=5") as response:
                body = response.extensions[BODY]
                assert isinstance(body, H1Body)
                assert b"".join([part async for part in body.parts()]) == parts(5)
            async with http.stream("GET", f"{running.url}/?stall=1") as response:
                with pytest.raises(httpx.ReadTimeout):
                    [part async for part in response.extensions[BODY].parts()]
            assert await streamed(http, f"{running.url}/?parts=1") == parts(1)
    assert len(set(clients)) == 2  # the first connection went back to the pool; the stalled one not


async def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connecting is refused
        async with fast_client() as http:
            with pytest.raises(httpx.ConnectError):
                await streamed(http, f"http://127.0.0.1:{port}/")


async def test_a_connect_that_hangs_is_a_connect_timeout():
    # A listener whose accept queue is full drops further SYNs: the handshake never completes.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        fillers = [socket.socket() for _ in range(4)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(address)
        try:
            async with fast_client() as http:
                with pytest.raises(httpx.ConnectTimeout):
                    await streamed(http, f"http://127.0.0.1:{address[1]}/")
        finally:
            for filler in fillers:
                filler.close()


async def test_a_full_pool_is_a_pool_timeout():
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        async with fast_client(connections=1, pool=0.2) as http:
            async with http.stream("GET", f"{running.url}/?stall=1"):
                with pytest.raises(httpx.PoolTimeout):
                    await streamed(http, f"{running.url}/?parts=1")


async def test_the_keep_alive_bound_counts_idle_connections_not_all_of_them():
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        transport = httpx.AsyncHTTPTransport()
        transport._pool = pool = FastPool(max_connections=10, max_keepalive_connections=2)
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as http:
            async with http.stream("GET", f"{running.url}/?stall=1"):
                await asyncio.gather(*(streamed(http, f"{running.url}/?parts=1") for _ in range(3)))
                # one busy, two idle kept: httpcore 1.0 compared all three with the bound of two
                assert len(pool.connections) == 3
                assert sum(conn.is_idle() for conn in pool.connections) == 2


async def test_a_full_pool_closes_an_idle_connection_to_another_origin_for_room():
    with run_server(parts_app([])) as one, run_server(parts_app([])) as other:
        async with fast_client(connections=1) as http:
            assert await streamed(http, f"{one.url}/?parts=2") == parts(2)
            assert await streamed(http, f"{other.url}/?parts=3") == parts(3)
            pool = http._transport._pool  # type: ignore[attr-defined]
            assert [conn.origin.port for conn in pool.connections] == [int(other.url.rsplit(":", 1)[1])]


async def test_queued_requests_take_the_connection_that_comes_back():
    clients: list[Any] = []
    with run_server(parts_app(clients)) as running:
        async with fast_client(connections=1) as http:
            bodies = await asyncio.gather(*(streamed(http, f"{running.url}/?parts={n}") for n in range(1, 6)))
    assert bodies == [parts(n) for n in range(1, 6)]
    assert len(set(clients)) == 1


async def test_the_pool_pass_takes_an_idle_connection_without_walking_the_others(monkeypatch):
    # httpcore 1.0's pass built a list of every connection for each idle one (at 500 streams ending
    # together, a third of the server's CPU); one walk a pass was still 0.2-0.4 ms a request at 500.
    # 40 connections, one of them idle: a request and its close ask a few of them, not all.
    with run_server(parts_app([])) as running:
        async with fast_client(connections=100) as http:
            stalls = [await http.send(http.build_request("GET", f"{running.url}/?stall=1"), stream=True)
                      for _ in range(39)]
            assert await streamed(http, f"{running.url}/?parts=1") == parts(1)
            pool = http._transport._pool  # type: ignore[attr-defined]
            assert len(pool.connections) == 40 and sum(conn.is_idle() for conn in pool.connections) == 1
            asked: list[str] = []
            for name in ("is_idle", "is_available", "has_expired", "is_closed"):
                real = getattr(H1Connection, name)

                def counted(self: H1Connection, real: Any = real, name: str = name) -> bool:
                    asked.append(name)
                    return bool(real(self))
                monkeypatch.setattr(H1Connection, name, counted)
            pool._next_sweep = math.inf  # no sweep in between: it walks every 0.25 s
            assert await streamed(http, f"{running.url}/?parts=2") == parts(2)
            assert len(pool.connections) == 40  # the idle one, taken and given back
            assert 0 < len(asked) <= 4, asked  # a walk would ask at least 40
            pool._next_sweep = 0.0
            assert await streamed(http, f"{running.url}/?parts=3") == parts(3)
            assert len(asked) > 40  # the sweep walks them all
            for response in stalls:
                await response.aclose()


async def test_a_full_pool_walks_its_connections_once_a_pass_however_many_wait(monkeypatch):
    with run_server(parts_app([])) as running:
        async with fast_client(connections=1) as http:
            pool = http._transport._pool  # type: ignore[attr-defined]
            async with http.stream("GET", f"{running.url}/?stall=1"):
                waiting = [asyncio.create_task(streamed(http, f"{running.url}/?parts=1")) for _ in range(20)]
                while sum(request.connection is None for request in pool._requests) < 20:
                    await asyncio.sleep(0)  # each waiting request has made its pass
                sweeps = 0
                real = FastPool._sweep

                def counted(self: FastPool, now: float) -> Any:
                    nonlocal sweeps
                    sweeps += 1
                    return real(self, now)
                monkeypatch.setattr(FastPool, "_sweep", counted)
                pool._next_sweep = math.inf
                assert pool._assign_requests_to_connections() == []  # one pass: 20 wait, none served
                assert sweeps == 1  # not one a waiting request
            assert await asyncio.gather(*waiting) == [parts(1)] * 20  # each took the one connection back


async def test_a_request_cancelled_before_it_starts_leaves_its_place_to_the_next():
    with run_server(parts_app([])) as running:
        async with fast_client(connections=1, pool=0.5) as http:
            pool = http._transport._pool  # type: ignore[attr-defined]
            request = AsyncPoolRequest(httpcore.Request("GET", f"{running.url}/?parts=1"))
            pool._requests.append(request)  # the pass gives it a new connection; then, as httpcore
            pool._assign_requests_to_connections()  # does when it is cancelled before starting:
            orphan = request.connection
            pool._requests.remove(request)
            pool._assign_requests_to_connections()
            assert await streamed(http, f"{running.url}/?parts=1") == parts(1)  # not a PoolTimeout
            assert pool.connections == [orphan] and orphan.is_idle()


async def test_the_sweep_drops_what_closed_and_reindexes_what_a_cancelled_request_left():
    with run_server(parts_app([])) as running:
        async with fast_client(connections=100) as http:
            await asyncio.gather(*(streamed(http, f"{running.url}/?parts=1") for _ in range(3)))
            pool = http._transport._pool  # type: ignore[attr-defined]
            first, second, third = pool.connections
            await first.aclose()  # closed while idle: not handed out, and gone at the next sweep
            pool._idle.clear()  # as a request cancelled between assignment and start leaves it
            pool._next_sweep = 0.0
            assert await streamed(http, f"{running.url}/?parts=2") == parts(2)
            assert pool.connections == [second, third]
            assert all(conn.is_idle() for conn in pool.connections)


async def test_a_header_that_would_break_framing_is_refused_before_sending():
    async with raw_server(answering(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")) as (url, accepted):
        async with fast_client() as http:
            with pytest.raises(httpx.LocalProtocolError):
                await http.get(url, headers={"x-bad": "a\r\nInjected: 1"})
            assert (await http.get(url)).status_code == 200


async def test_tls_streams_and_keeps_the_connection(tmp_path: Path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    clients: list[Any] = []
    with run_server(parts_app(clients), ssl_certfile=str(cert), ssl_keyfile=str(key)) as running:
        url = running.url.replace("http://", "https://")
        async with fast_client(ssl.create_default_context(cafile=str(cert))) as http:
            assert await streamed(http, f"{url}/?parts=300") == parts(300)
            assert await streamed(http, f"{url}/?parts=1") == parts(1)
        async with fast_client(ssl.create_default_context()) as untrusting:
            with pytest.raises(httpx.ConnectError):
                await streamed(untrusting, f"{url}/")
    assert len(set(clients)) == 1
