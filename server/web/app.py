"""The application factory: routes, lifespan, authentication.

``create_app(settings)`` builds the Starlette app. Its lifespan opens the store, builds one provider
per profile, the route resolver, the observer bus and the session hub, and runs turns in a task
group that outlives any single connection. Routes: ``/`` and ``/s/{session_id}`` (the page),
``/static``, ``/ws`` (protocol v1), ``/events`` (observer bus as SSE), ``/api/sessions...``,
``/healthz``, and the accounts' ``/signin``, ``/admin`` and ``/api/auth/...`` (server.web.signin,
server.web.oidc). Who is asking is decided before routing by ``server.web.auth.Authenticator``
(``[auth] mode``: none, a bearer token, a sign-in cookie or API token, a trusted proxy's header);
``/ws`` also checks the Origin (refused before the handshake), closes a socket without a viewer
with 4401 after accepting it, and closes a signed-in user's socket with 4401 once their sign-in is
revoked (server.web.revocation).

The lifespan yields the shared services as typed state (``AppState``); handlers read them from
``request.state`` / ``websocket.state``. API errors become the one envelope through
``exception_handlers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.websockets import WebSocket

from server.accounts.directory import Directory
from server.accounts.viewer import ANYONE, Viewer, viewer_in
from server.config.load import load_settings
from server.config.settings import AuthSettings, Settings
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
from server.store.base import Store
from server.tools.toolbox import Toolbox
from server.web.access import AccessGuard, redact_tokens_in_logs
from server.web.api import EXCEPTION_HANDLERS, ApiState, OnChange, api_routes
from server.web.auth import Authenticator, offered_subprotocols
from server.web.connection import Connection
from server.web.limits import UserBuckets
from server.web.ops import healthz, metrics_endpoint, readyz
from server.web.revocation import Revocations
from server.web.signin import Signin, signin_routes


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
TOKEN_REFUSED = 4401  # the socket's 401: the token is missing or wrong, or the sign-in was revoked


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
    revocations: Revocations
    ready_checks: Mapping[str, Callable[[], Awaitable[None]]]
    user_buckets: UserBuckets


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or load_settings()
    # here, not in the lifespan: a bad folder or an unreachable database stops start-up
    store = open_store(settings.server.data_dir, settings.store.url, settings.store.pool_size,
                       settings.store.timeout_seconds)
    metrics = PrometheusMetrics() if settings.server.metrics else Metrics()

    mode = settings.auth_mode
    revocations = Revocations(store, settings.auth.revocation_check_ms / 1000)
    user_buckets = UserBuckets(settings.auth.user_frame_rate, settings.auth.user_frame_burst)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[AppState]:
        providers = {alias: build_provider(p) for alias, p in settings.providers.items()}
        live = RedisLive(settings.live, EventBus()) if settings.live.url else None
        if mode in ("accounts", "header"):
            await Directory(store).adopt_orphans()  # sessions from before accounts: the first admin's
        try:
            async with anyio.create_task_group() as tasks:
                if mode in ("accounts", "header"):
                    tasks.start_soon(revocations.run)
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
                       "revocations": revocations, "ready_checks": checks, "user_buckets": user_buckets}
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
        viewer: Viewer | None = viewer_in(request.scope)
        response = templates.TemplateResponse(request, "index.html", {
            "static_prefix": "/static", "auth_required": mode == "token", "auth_mode": mode,
            "user": viewer.user if viewer is not None else None, "page_config": page_config})
        response.headers["Content-Security-Policy"] = PAGE_POLICY
        return response

    async def websocket_endpoint(websocket: WebSocket[AppState]) -> None:
        if not origin_allowed(websocket, settings.server.allowed_origins):
            await websocket.close(code=1008, reason="origin not allowed")
            return
        offered = offered_subprotocols(websocket)
        await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
        viewer = viewer_in(websocket.scope)
        if viewer is None:
            # Accepted first: a browser sees the close code of an accepted socket only, and 4401
            # tells the page to ask for the token (or a sign-in) again instead of reconnecting for good.
            await websocket.close(code=TOKEN_REFUSED, reason="unauthorized")
            return
        metrics.socket_opened()
        try:
            await watched_connection(websocket, viewer)
        finally:
            metrics.socket_closed()

    signin = Signin(mode, settings.auth.session_days, settings.auth.signin_attempts, templates, PAGE_POLICY,
                    sso=bool(settings.auth.oidc_issuer))
    sso_routes, sso_middleware = single_sign_on(settings.auth, signin)
    operators = [Route("/healthz", healthz(settings)), Route("/readyz", readyz)]
    if settings.server.metrics:
        operators.append(Route("/metrics", metrics_endpoint(metrics)))
    app = Starlette(routes=[
        Route("/", page), Route("/s/{session_id}", page), *operators,
        Route("/events", events), WebSocketRoute("/ws", websocket_endpoint),
        Mount("/static", StaticFiles(directory=str(asset_folder("static"))), name="static"),
        Route("/api/sessions/{session_id}/images/{message_id}/{n:int}", session_image),
        *api_routes(settings.server.max_import_bytes), *signin_routes(signin),
        *sso_routes,
    ], lifespan=lifespan, exception_handlers=EXCEPTION_HANDLERS,
        middleware=sso_middleware)
    app.add_middleware(Authenticator, mode=mode, auth=settings.auth, token=settings.server.auth_token)
    app.add_middleware(AccessGuard, bind_host=settings.server.host,  # outermost: before auth
                       allowed_hosts=settings.server.allowed_hosts,
                       allowed_origins=settings.server.allowed_origins)
    redact_tokens_in_logs()
    return app


def single_sign_on(auth: AuthSettings, signin: Signin) -> tuple[list[Route], list[Middleware]]:
    """The OIDC routes and the middleware keeping their state, when ``[auth] oidc_issuer`` is set.
    authlib (and cryptography) are imported only by a server that signs in through OIDC."""
    if not auth.oidc_issuer:
        return [], []
    from server.web.oidc import OidcSignin, oidc_routes

    oidc = OidcSignin(auth, signin)
    return oidc_routes(oidc), [oidc.middleware()]


async def watched_connection(websocket: WebSocket[AppState], viewer: Viewer) -> None:
    """Serve the socket until it ends or its sign-in is revoked; then close it with 4401."""
    state = websocket.state
    # A revoked sign-in cancels the connection's scope from the revocation check itself: no task per
    # socket waits for it (one of five per socket, each a coroutine, a context and a scope to build).
    with anyio.CancelScope() as scope, state["revocations"].track(viewer, scope.cancel) as revoked, \
            state["user_buckets"].of(viewer.owner) as bucket:
        await Connection(websocket, state["hub"], viewer.owner, bucket).run()
    if revoked.is_set():
        with contextlib.suppress(RuntimeError, OSError):
            await websocket.close(code=TOKEN_REFUSED, reason="signed out")


async def events(request: Request[AppState]) -> Response:
    """The observer bus; a signed-in user's stream carries their own sessions' events (an admin's, all)
    and ends when their sign-in is revoked."""
    viewer = viewer_in(request.scope) or ANYONE
    allowed = None if viewer.sees_all_events else OwnedSessions(request.state["store"], viewer)
    bus, revocations = request.state["bus"], request.state["revocations"]

    async def stream() -> AsyncIterator[str]:
        subscription = bus.subscribe()
        try:
            with revocations.track(viewer, subscription.cut):
                async for chunk in sse_stream(bus, allowed=allowed, subscription=subscription):
                    yield chunk
        finally:
            bus.unsubscribe(subscription)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


class OwnedSessions:
    """Whether a session is the viewer's, asked of the store once per session (an owner never changes)
    and remembered for the last ``LIMIT`` sessions seen."""

    LIMIT = 1024

    def __init__(self, store: Store, viewer: Viewer) -> None:
        self.store = store
        self.viewer = viewer
        self.known: dict[str, bool] = {}

    async def __call__(self, session_id: str) -> bool:
        if session_id not in self.known:
            owner = await self.store.session_owner(session_id)
            if owner is None:
                return False  # not stored yet (a new session's first lines): asked again next time
            if len(self.known) >= self.LIMIT:
                self.known.pop(next(iter(self.known)))
            self.known[session_id] = self.viewer.sees(owner)
        return self.known[session_id]


async def session_image(request: Request[AppState]) -> Response:
    """An attached image, by URL (``server.sessions.views.image_url``); ``/api``'s guard covers it, and
    another user's session answers as a missing one."""
    params = request.path_params
    viewer = viewer_in(request.scope)
    owner = viewer.owner if viewer is not None else None
    messages = await request.state["hub"].messages_of(params["session_id"], owner)
    return image_response(find_image(messages, params["message_id"], params["n"]))


def live_sessions_follow(hub: SessionHub) -> OnChange:
    """The API's ``on_change``: a renamed or deleted session's live copy follows the store."""

    async def on_change(session_id: str, what: str) -> None:
        if what == "deleted":
            hub.deleted(session_id)
        elif what == "renamed":
            await hub.renamed(session_id)

    return on_change
