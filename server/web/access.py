"""The front door: which requests may reach the app at all, checked before routing or auth.

``AccessGuard`` is pure ASGI middleware over every HTTP and WebSocket request:

- ``Host`` must name this server: a loopback name (``127.0.0.1``, ``localhost``, ``[::1]``, any
  port), the configured bind address, the local address the connection arrived on (an IP literal a
  page cannot choose), or an entry of ``[server] allowed_hosts`` (``*.example.com`` matches
  subdomains, ``*`` turns the check off). This is what defeats DNS rebinding: the attacker's page
  can point its name at 127.0.0.1 but cannot make the browser send ``Host: 127.0.0.1``.
  Refused with 400 (HTTP) or a refused handshake (WebSocket).
- State-changing REST requests (POST/PUT/PATCH/DELETE under ``/api``) need
  ``Content-Type: application/json`` (415), which a plain HTML form cannot send without a CORS
  preflight this server never answers (a DELETE without a body is exempt, see ``needs_json``).
- On those and on every WebSocket handshake, an ``Origin`` (when sent) must be one of
  ``[server] allowed_origins`` or this server itself: its host allow-listed and equal to ``Host``;
  ``Sec-Fetch-Site: cross-site`` is refused unless the origin is explicitly allowed (403).

``exposure_problem`` is the start-up rule for binding beyond loopback without a token, and
``redact_tokens_in_logs`` keeps ``?token=`` values out of uvicorn's access and error logs.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from server.protocol import echo

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def host_name(host: str) -> str:
    """The name part of a ``Host`` header or netloc, lower-cased, without port or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") > 1:
        return host  # a bare IPv6 address (not valid in Host, but a valid setting)
    return host.rsplit(":", 1)[0] if ":" in host else host


def host_matches(name: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern == "*" or pattern == name:
            return True
        if pattern.startswith("*.") and name.endswith(pattern[1:]):
            return True
    return False


def default_hosts(bind_host: str, extra: Sequence[str]) -> tuple[str, ...]:
    """Loopback names, the bound address (unless it is a wildcard) and the configured extras."""
    bound = () if bind_host in WILDCARD_BINDS else (host_name(bind_host),)
    return (*LOOPBACK_HOSTS, *bound, *(host_name(h) if not h.startswith("*") else h.lower()
                                      for h in extra))


def is_loopback(host: str) -> bool:
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def exposure_problem(host: str, auth_token: str, mode: str = "") -> str | None:
    """Why serving on ``host`` without a token is refused, in one line; None when it is fine (a
    token, or ``[auth] mode`` accounts or header, where every request names its user)."""
    if auth_token or is_loopback(host) or mode in ("accounts", "header"):
        return None
    return (f"refusing to listen on {host} without an auth token: anyone who can reach it could read "
            "every conversation and spend your provider keys. Set one with METERCHAT_SERVER_AUTH_TOKEN="
            "<long random string> (or auth_token in [server]), or use accounts ([auth] mode = "
            "\"accounts\"), or pass --insecure-no-auth if a proxy "
            "in front does the authentication")


def needs_json(method: str, headers: Headers) -> bool:
    """Every state-changing request with a body. A body-less DELETE is exempt: no form can send a
    DELETE, and a cross-site script's needs a CORS preflight that this server never grants."""
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    return method != "DELETE" or has_body or "content-type" in headers


def media_type(headers: Headers) -> str:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


class AccessGuard:
    def __init__(self, app: ASGIApp, *, bind_host: str, allowed_hosts: Sequence[str],
                 allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.hosts = default_hosts(bind_host, allowed_hosts)
        self.origins = frozenset(origin.rstrip("/").lower() for origin in allowed_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket" and "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008, "reason": refusal[2]})
        else:
            body = {"error": {"code": refusal[1], "message": refusal[2]}}
            await JSONResponse(body, status_code=refusal[0])(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, message) when the request is refused, None when it may go on."""
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if not self.host_allowed(host, scope):
            return 400, "bad_host", (f"Host {echo(host)} is not allowed; add it to [server] "
                                     "allowed_hosts")
        if scope["type"] == "http" and not self.changes_state(scope):
            return None
        if scope["type"] == "http" and needs_json(scope["method"], headers) and \
                media_type(headers) != "application/json":
            return 415, "unsupported_media_type", "send Content-Type: application/json"
        return self.origin_refusal(headers, host)

    def host_allowed(self, host: str, scope: Scope) -> bool:
        name = host_name(host)
        if not name:
            return False
        server = scope.get("server")
        # The address the connection arrived on is an IP literal: a page can only send it as Host
        # when the browser itself was pointed at this server (a LAN address on a 0.0.0.0 bind).
        if server and name == host_name(str(server[0])) and _is_ip(name):
            return True
        return host_matches(name, self.hosts)

    @staticmethod
    def changes_state(scope: Scope) -> bool:
        path: str = scope["path"]
        return scope["method"] in STATE_CHANGING and (path == "/api" or path.startswith("/api/"))

    def origin_refusal(self, headers: Headers, host: str) -> tuple[int, str, str] | None:
        origin = headers.get("origin")
        explicitly_allowed = origin is not None and origin.rstrip("/").lower() in self.origins
        if headers.get("sec-fetch-site") == "cross-site" and not explicitly_allowed:
            return 403, "forbidden_origin", "cross-site requests are refused"
        if origin is None or explicitly_allowed:
            return None  # no Origin: not a browser page, and the token (if any) is the guard
        netloc = urlsplit(origin).netloc.lower()
        if netloc and netloc == host.strip().lower() and host_matches(host_name(netloc), self.hosts):
            return None
        return 403, "forbidden_origin", (f"Origin {echo(origin)} is not this server; add it to "
                                         "[server] allowed_origins")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


_TOKEN_IN_URL = re.compile(r"([?&](?:token|access_token)=)[^&\s\"']*", re.IGNORECASE)


def redact(text: str) -> str:
    return _TOKEN_IN_URL.sub(r"\1[redacted]", text)


class TokenRedaction(logging.Filter):
    """Replaces ``?token=...`` values in a log record (uvicorn logs the path with its query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(arg) if isinstance(arg, str) else arg for arg in record.args)
        return True


_REDACTION = TokenRedaction()


def redact_tokens_in_logs() -> None:
    """Install the redaction on the loggers uvicorn writes request lines to (idempotent; logging
    configuration keeps a logger's filters, so uvicorn setting up its handlers later is fine)."""
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if _REDACTION not in logger.filters:
            logger.addFilter(_REDACTION)
