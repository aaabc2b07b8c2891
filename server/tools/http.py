"""The Streamable HTTP transport for MCP servers: headers from the environment, bounded reads.

Header values come from the environment variables ``headers_env`` names (a secret never sits in the
file); a variable that is unset is left out and logged by name (never by value). A JSON response
over ``max_result_bytes`` fails while it is read (the SDK answers its request with an error), and
an SSE event over it fails in the SDK's own reader (``max_sse_event_size``): neither is held whole.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx2
from mcp.client.streamable_http import streamable_http_client

from server.config.settings import McpServerSettings

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 30.0
READ_TIMEOUT_SECONDS = 300.0  # the server may hold its event stream open; calls have their own timeout


class ResponseTooLarge(httpx2.StreamError):
    """A response body over the server's ``max_result_bytes``, stopped while read."""


class _BoundedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self.inner = inner
        self.limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        read = 0
        async for chunk in self.inner:
            read += len(chunk)
            if read > self.limit:
                raise ResponseTooLarge(f"the MCP server's response passed max_result_bytes ({self.limit:,} "
                                       f"bytes); it was dropped while read")
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class BoundedTransport(httpx2.AsyncBaseTransport):
    """httpx2's transport with every JSON body bounded (SSE streams are bounded per event)."""

    def __init__(self, limit: int) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if not response.headers.get("content-type", "").startswith("application/json"):
            return response
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        return httpx2.Response(response.status_code, headers=response.headers, request=request,
                               stream=_BoundedStream(response.stream, self.limit),
                               extensions=response.extensions)

    async def aclose(self) -> None:
        await self.inner.aclose()


def headers_from_env(settings: McpServerSettings, env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    headers = {}
    for header, variable in settings.headers_env.items():
        if variable in env:
            headers[header] = env[variable]
        else:
            log.warning("MCP server %s: environment variable %s (header %s) is not set; the header is "
                        "left out", settings.name, variable, header)
    return headers


def http_transport(settings: McpServerSettings) -> Any:
    """An MCP transport to ``settings.url`` (its client closed with the transport)."""
    client = httpx2.AsyncClient(
        headers=headers_from_env(settings), transport=BoundedTransport(settings.max_result_bytes),
        timeout=httpx2.Timeout(CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS))
    return _owning(client, streamable_http_client(settings.url, http_client=client,
                                                  max_sse_event_size=settings.max_result_bytes))


class _owning:
    """Enters the SDK's transport and closes the httpx2 client after it (the SDK leaves a client it
    was given open)."""

    def __init__(self, client: httpx2.AsyncClient, transport: Any) -> None:
        self.client = client
        self.transport = transport

    async def __aenter__(self) -> Any:
        await self.client.__aenter__()
        try:
            return await self.transport.__aenter__()
        except BaseException:
            await self.client.aclose()
            raise

    async def __aexit__(self, *exc: Any) -> bool | None:
        try:
            return await self.transport.__aexit__(*exc)
        finally:
            await self.client.aclose()
