"""Who is asking: ``[auth] mode`` applied to every request before routing (``Authenticator``).

- ``none``: nobody signs in; every request speaks for ``ANYONE`` (loopback by default; an exposed
  bind is refused at start-up, ``server.web.access.exposure_problem``).
- ``token``: ``/api``, ``/events`` and ``/ws`` need ``server.auth_token`` as a bearer token (the
  ``Authorization`` header, a ``bearer.<base64url>`` WebSocket subprotocol, or ``?token=``).
- ``accounts``: a sign-in cookie (``COOKIE``: a random id; the store keeps its SHA-256 and checks it,
  the user and the expiry on every request) or a per-user API token (``Authorization: Bearer mc_...``).
- ``header``: the user named by ``[auth] user_header``, believed only when the peer address is one
  of ``[auth] trusted_proxies``; any other peer is refused (403) whatever it sends. A name seen for
  the first time becomes an account (the first one an admin).

The viewer goes to the routes as ``request.state["viewer"]``. A request without one gets 401 (the
page: a redirect to ``/signin``); a socket is accepted and closed with 4401, which the page reads
as "sign in again". ``/healthz``, ``/readyz``, ``/static``, ``/signin`` (with its OIDC steps) and
``POST /api/auth/signin`` are open.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
from collections.abc import Sequence
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from server.accounts.directory import Directory
from server.accounts.viewer import ANYONE, Viewer
from server.config.settings import AuthSettings
from server.errors import ClientError
from server.store.base import Store
from server.store.users import utc_now

COOKIE = "meterchat_signin"
TOKEN_PREFIX = "mc_"  # an API token's secret starts so: told apart from a cookie value or server token
BEARER_PREFIX = "bearer."
OPEN_PATHS = ("/healthz", "/readyz", "/signin", "/api/auth/signin", "/signin/oidc", "/signin/oidc/callback")
HEALTH_PATHS = ("/healthz", "/readyz")  # a load balancer's probes: open in every mode
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def offered_subprotocols(conn: HTTPConnection[Any]) -> list[str]:
    header = conn.headers.get("sec-websocket-protocol", "")
    return [part.strip() for part in header.split(",") if part.strip()]


def given_token(conn: HTTPConnection[Any]) -> str:
    """The bearer token from the Authorization header, a ``bearer.<base64url>`` WebSocket subprotocol
    (what a browser can send without putting the token in a URL that logs keep), or ``?token=``."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:]
    for offered in offered_subprotocols(conn):
        if offered.startswith(BEARER_PREFIX):
            encoded = offered[len(BEARER_PREFIX):]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except (ValueError, UnicodeDecodeError):
                return ""
    return conn.query_params.get("token", "")


def authorized(conn: HTTPConnection[Any], token: str) -> bool:
    if not token:
        return True
    return hmac.compare_digest(given_token(conn).encode(), token.encode())


def secret_key(secret: str) -> str:
    """What the store keeps of a cookie's id or an API token: its SHA-256 (a leaked database row
    signs nobody in; the secrets are 256 random bits, so no salt or slow hash is needed)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def networks(entries: Sequence[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries)


def peer_trusted(scope: Scope, trusted: Sequence[Network]) -> bool:
    client = scope.get("client")
    if not client:
        return False
    try:
        address = ipaddress.ip_address(str(client[0]))
    except ValueError:
        return False
    return any(address in network for network in trusted)


def is_page(path: str) -> bool:
    return path in ("/", "/admin") or path.startswith("/s/")


def is_open(path: str, mode: str) -> bool:
    if path in OPEN_PATHS or path.startswith("/static/"):
        return True
    return mode == "token" and is_page(path)  # the page asks for the token itself


class Authenticator:
    """The ASGI middleware: finds the viewer of every guarded request, or answers for it."""

    def __init__(self, app: ASGIApp, *, mode: str, auth: AuthSettings, token: str) -> None:
        self.app = app
        self.mode = mode
        self.auth = auth
        self.token = token
        self.trusted = networks(auth.trusted_proxies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.mode == "none":
            if scope["type"] in ("http", "websocket"):
                scope.setdefault("state", {})["viewer"] = ANYONE
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.mode == "header" and not peer_trusted(scope, self.trusted) and path not in HEALTH_PATHS:
            await refuse(scope, receive, send, 403, "forbidden",
                         "this server takes requests only through its authenticating proxy")
            return
        viewer = await self.identify(scope)
        scope.setdefault("state", {})["viewer"] = viewer
        if viewer is None and scope["type"] == "http" and not is_open(path, self.mode):
            if is_page(path) and self.mode == "accounts":
                await RedirectResponse("/signin", status_code=303)(scope, receive, send)
                return
            await refuse(scope, receive, send, 401, "unauthorized", self.refusal_text())
            return
        await self.app(scope, receive, send)  # a socket without a viewer is closed with 4401

    def refusal_text(self) -> str:
        return {"token": "bearer token required", "accounts": "sign in first (or send an API token)",
                "header": f"no user in {self.auth.user_header}"}.get(self.mode, "unauthorized")

    async def identify(self, scope: Scope) -> Viewer | None:
        conn: HTTPConnection[Any] = HTTPConnection(scope)
        if self.mode == "token":
            return ANYONE if authorized(conn, self.token) else None
        store: Store = scope["state"]["store"]
        if self.mode == "header":
            return await self.header_user(conn, store)
        cookie = conn.cookies.get(COOKIE, "")
        if cookie:
            key = secret_key(cookie)
            user = await store.login_user(key, utc_now())
            if user is not None:
                return Viewer(user, login=key)
        token = given_token(conn)
        if token.startswith(TOKEN_PREFIX):
            key = secret_key(token)
            user = await store.token_user(key, utc_now())
            if user is not None:
                return Viewer(user, token=key)
        return None

    async def header_user(self, conn: HTTPConnection[Any], store: Store) -> Viewer | None:
        name = conn.headers.get(self.auth.user_header, "").strip()
        if not name:
            return None
        user = await store.find_user(name)
        if user is None:
            try:
                user = await Directory(store).add(name, None, email=name if "@" in name else "")
            except ClientError:  # a bad name, or another request made the account a moment ago
                user = await store.find_user(name)
        return Viewer(user) if user is not None and not user.disabled else None


async def refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = {"error": {"code": code, "message": message}}
    await JSONResponse(body, status_code=status)(scope, receive, send)
