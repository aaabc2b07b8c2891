"""The application factory: routes, lifespan, authentication.

``create_app(settings)`` builds the Starlette app. Its lifespan opens the store, builds one provider
per profile, the route resolver, the observer bus and the session hub, and runs turns in a task
group that outlives any single connection. Routes: ``/`` and ``/s/{session_id}`` (the page),
``/static``, ``/ws`` (protocol v1), ``/events`` (observer bus as SSE), ``/api/sessions...``,
``/healthz``. When ``server.auth_token`` is set, ``/ws``, ``/events`` and ``/api`` need it as a
bearer token (``Authorization`` header or ``?token=``); ``/ws`` also checks the Origin
(refused before the handshake) and closes a socket with a wrong token with 4401 after accepting it.

The lifespan yields the shared services as typed state (``AppState``); handlers read them from
``request.state`` / ``websocket.state``. API errors become the one envelope through
``exception_handlers``.
"""

from __future__ import annotations

import base64
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from server.config.load import load_settings
from server.config.settings import Settings
from server.live.redis_live import RedisLive
from server.live.turns import LiveInstances
from server.providers import build_provider
from server.routing.resolver import RouteResolver
from server.sessions.events import EventBus, sse_stream
from server.sessions.hub import SessionHub
from server.sessions.images import find_image, image_response
from server.sessions.instances import SoleInstance
from server.sessions.metrics import Metrics, PrometheusMetrics
from server.sessions.runtime import Runtime
from server.store.backends import open_store
from server.tools.toolbox import Toolbox
from server.web.access import AccessGuard, redact_tokens_in_logs
from server.web.api import EXCEPTION_HANDLERS, ApiState, OnChange, api_routes, error_body
from server.web.connection import Connection
from server.web.ops import healthz, metrics_endpoint, readyz


def asset_folder(name: str) -> Path:
    """``static/`` or ``templates/``: inside the installed package (a wheel ships them as package data
    under ``server/``), else at the top of the checkout, where the design card keeps them."""
    package = Path(__file__).resolve().parent.parent
    shipped = package / name
    return shipped if shipped.is_dir() else package.parent / name


templates = Jinja2Templates(directory=str(asset_folder("templates")))
# Defence in depth behind the sanitiser: no script but our own files, no remote images (a model's
# markdown cannot be used to track the reader), sockets and fetches only to this server.
PAGE_POLICY = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
               "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
               "frame-ancestors 'none'")


SUBPROTOCOL = "meterchat.v1"
TOKEN_REFUSED = 4401  # the socket's 401: the token is missing or wrong
BEARER_PREFIX = "bearer."


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


def origin_allowed(conn: HTTPConnection[Any], allowed: list[str]) -> bool:
    origin = conn.headers.get("origin")
    if origin is None:
        return True  # not a browser: the token (if any) is the guard
    if origin in allowed:
        return True
    return urlsplit(origin).netloc == conn.headers.get("host", "")


class AppState(ApiState):
    """The lifespan's state: every handler reads the shared services from ``request.state``."""

    hub: SessionHub
    bus: EventBus
    ready_checks: Mapping[str, Callable[[], Awaitable[None]]]


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or load_settings()
    # here, not in the lifespan: a bad folder or an unreachable database stops start-up
    store = open_store(settings.server.data_dir, settings.store.url, settings.store.pool_size,
                       settings.store.timeout_seconds)
    metrics = PrometheusMetrics() if settings.server.metrics else Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[AppState]:
        providers = {alias: build_provider(p) for alias, p in settings.providers.items()}
        live = RedisLive(settings.live, EventBus()) if settings.live.url else None
        try:
            async with anyio.create_task_group() as tasks:
                toolbox = Toolbox(settings.mcp_servers, settings.runtime.max_image_bytes)
                await toolbox.start(tasks)
                rt = Runtime(settings, store, providers, RouteResolver(settings, providers),
                             live.bus if live else EventBus(), tasks, metrics, toolbox)
                if live is not None:
                    await live.start(tasks, rt.resolver)
                hub = SessionHub(rt, LiveInstances(live) if live else SoleInstance(rt.bus))
                app.state.drain = hub.drain  # awaited first on SIGTERM (server.web.serving.DrainingServer)
                checks = {"store": store.ping, **({"live": live.ping} if live else {})}
                yield {"store": store, "on_change": live_sessions_follow(hub), "hub": hub, "bus": rt.bus,
                       "ready_checks": checks}
                tasks.cancel_scope.cancel()
        finally:
            if live is not None:
                await live.aclose()
            for provider in providers.values():
                await provider.aclose()
            await store.close()

    # Values the page would otherwise copy into its JavaScript (templates/index.html's page-config).
    page_config = {"subprotocol": SUBPROTOCOL, "max_image_bytes": settings.runtime.max_image_bytes}

    async def page(request: Request) -> Response:
        response = templates.TemplateResponse(request, "index.html", {
            "static_prefix": "/static", "auth_required": bool(settings.server.auth_token),
            "page_config": page_config})
        response.headers["Content-Security-Policy"] = PAGE_POLICY
        return response

    async def websocket_endpoint(websocket: WebSocket[AppState]) -> None:
        if not origin_allowed(websocket, settings.server.allowed_origins):
            await websocket.close(code=1008, reason="origin not allowed")
            return
        offered = offered_subprotocols(websocket)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        if not authorized(websocket, settings.server.auth_token):
            # Accepted first: a browser sees the close code of an accepted socket only, and 4401
            # tells the page to ask for the token again instead of reconnecting for good.
            await websocket.close(code=TOKEN_REFUSED, reason="unauthorized")
            return
        metrics.socket_opened()
        try:
            await Connection(websocket, websocket.state["hub"]).run()
        finally:
            metrics.socket_closed()

    operators = [Route("/healthz", healthz(settings)), Route("/readyz", readyz)]
    if settings.server.metrics:
        operators.append(Route("/metrics", metrics_endpoint(metrics)))
    app = Starlette(routes=[
        Route("/", page), Route("/s/{session_id}", page), *operators,
        Route("/events", events), WebSocketRoute("/ws", websocket_endpoint),
        Mount("/static", StaticFiles(directory=str(asset_folder("static"))), name="static"),
        Route("/api/sessions/{session_id}/images/{message_id}/{n:int}", session_image),
        *api_routes(settings.server.max_import_bytes),
    ], lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS)
    app.add_middleware(BearerAuth, token=settings.server.auth_token)
    app.add_middleware(AccessGuard, bind_host=settings.server.host,  # outermost: before auth
                       allowed_hosts=settings.server.allowed_hosts,
                       allowed_origins=settings.server.allowed_origins)
    redact_tokens_in_logs()
    return app


async def events(request: Request[AppState]) -> Response:
    return StreamingResponse(sse_stream(request.state["bus"]), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def session_image(request: Request[AppState]) -> Response:
    """An attached image, by URL (``server.sessions.views.image_url``); ``/api``'s token guards it."""
    params = request.path_params
    messages = await request.state["hub"].messages_of(params["session_id"])
    return image_response(find_image(messages, params["message_id"], params["n"]))


def live_sessions_follow(hub: SessionHub) -> OnChange:
    """The API's ``on_change``: a renamed or deleted session's live copy follows the store."""

    async def on_change(session_id: str, what: str) -> None:
        if what == "deleted":
            hub.deleted(session_id)
        elif what == "renamed":
            await hub.renamed(session_id)

    return on_change


# Built once: the answer is the same for every refused request.
UNAUTHORIZED = JSONResponse(error_body("unauthorized", "bearer token required"), status_code=401)


class BearerAuth:
    """Bearer-token guard for ``/api`` and ``/events``; the socket checks for itself, since a
    WebSocket with a wrong token is accepted and closed with 4401, not answered with a 401."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _guarded(scope["path"]) and \
                not authorized(HTTPConnection(scope), self.token):
            await UNAUTHORIZED(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _guarded(path: str) -> bool:
    return path.startswith("/api") or path in ("/events", "/metrics")

