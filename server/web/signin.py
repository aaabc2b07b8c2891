"""Signing in and out, API tokens, and the admin's user listing (``[auth] mode = "accounts"``).

    GET    /signin                    the sign-in page (templates/signin.html)
    POST   /api/auth/signin           {"name", "password"} -> 200 {"user"} and the sign-in cookie
    POST   /api/auth/signout          204; the sign-in is deleted and this instance's sockets closed
    GET    /api/auth/me               200 {"mode", "user"}
    GET    /api/auth/tokens           200 [{id, name, created_at, last_used}]
    POST   /api/auth/tokens           {"name"} -> 201 {"id", "name", "token"} (the secret, shown once)
    DELETE /api/auth/tokens/{id}      204
    GET    /api/admin/users           200 [user with sessions, tokens and cost this month]; admins only
    GET    /admin                     the same as a page; 404 for anyone but an admin

Every POST goes through the front door's rules (``server.web.access``: JSON only, same Origin), so a
page elsewhere can neither sign a visitor in nor out. The cookie is HttpOnly, SameSite=Lax, Secure
when the request came over TLS (directly or through a proxy that says so), and lasts
``[auth] session_days``. Failed sign-ins are limited per address and name (``SigninLimiter``).
"""

from __future__ import annotations

import secrets
import time
import uuid
from collections import OrderedDict, deque
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from server.accounts.passwords import MAX_PASSWORD_CHARS, verify
from server.accounts.usage import month_start, usage_rows
from server.accounts.viewer import Viewer, viewer_in
from server.errors import ClientError, NotFound, SigninFlood, Unauthorized
from server.store.base import Store
from server.store.users import ApiToken, User, utc_now
from server.web.api import Reading, read_json
from server.web.auth import COOKIE, TOKEN_PREFIX, secret_key
from server.web.revocation import Revocations

MAX_SIGNIN_BYTES = 8 * 1024
MAX_TOKEN_NAME_CHARS = 64
MAX_TOKENS = 50  # API tokens per user
MAX_TRACKED = 10_000  # (address, name) pairs whose failures are remembered
WINDOW_SECONDS = 60.0


class SigninLimiter:
    """At most ``attempts`` sign-ins a minute for one name from one address (a success forgets that
    name's), and four times that for any names from one address; the next is refused (429) with the
    wait, before any password is hashed. An attempt counts when it starts, so many sent at once are
    held to the same bound. Kept per process (a bound, not a ledger: an attacker spreading over
    instances gets a multiple of it, never unlimited)."""

    def __init__(self, attempts: int, clock: Any = time.monotonic) -> None:
        self.attempts = attempts
        self.clock = clock
        self.failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()

    def attempt(self, address: str, name: str) -> None:
        """Count an attempt, or refuse it (``SigninFlood``) when it is one too many."""
        for key, limit in (((address, name.lower()), self.attempts), ((address, ""), 4 * self.attempts)):
            times = self._recent(key)
            if len(times) >= limit:
                wait = max(1, round(times[0] + WINDOW_SECONDS - self.clock()))
                raise SigninFlood(f"too many failed sign-ins from your address; try again in {wait} s")
        for key in ((address, name.lower()), (address, "")):
            self.failures.setdefault(key, deque()).append(self.clock())
            self.failures.move_to_end(key)
        while len(self.failures) > MAX_TRACKED:
            self.failures.popitem(last=False)

    def succeeded(self, address: str, name: str) -> None:
        self.failures.pop((address, name.lower()), None)

    def _recent(self, key: tuple[str, str]) -> deque[float]:
        times = self.failures.get(key, deque())
        while times and times[0] < self.clock() - WINDOW_SECONDS:
            times.popleft()
        return times


def viewer_of(request: Request[Any]) -> Viewer:
    viewer: Viewer | None = viewer_in(request.scope)
    if viewer is None or viewer.user is None:
        raise Unauthorized("sign in first")
    return viewer


def store_of(request: Request[Any]) -> Store:
    store: Store = request.state["store"]
    return store


def address_of(request: Request[Any]) -> str:
    return request.client.host if request.client else ""


class Signin:
    def __init__(self, mode: str, session_days: float, attempts: int, templates: Any, policy: str,
                 sso: bool = False) -> None:
        self.mode = mode
        self.sso = sso  # a "single sign-on" button on the page (server.web.oidc)
        self.lifetime = session_days * 86400
        self.limiter = SigninLimiter(attempts)
        self.reading = Reading(64 * MAX_SIGNIN_BYTES)
        self.templates = templates
        self.policy = policy

    async def page(self, request: Request[Any]) -> Response:
        if self.mode != "accounts":
            return RedirectResponse("/", status_code=303)
        response = self.templates.TemplateResponse(request, "signin.html", {"static_prefix": "/static",
                                                                            "sso": self.sso})
        response.headers["Content-Security-Policy"] = self.policy
        return response

    async def signin(self, request: Request[Any]) -> Response:
        if self.mode != "accounts":
            raise NotFound("this server has no accounts to sign in to")
        name, password = _credentials(await read_json(request, MAX_SIGNIN_BYTES, self.reading))
        address = address_of(request)
        self.limiter.attempt(address, name)
        store = store_of(request)
        user = await store.find_user(name)
        good = await verify(user.password_hash if user else None, password)
        if user is None or not good or user.disabled:
            raise Unauthorized("wrong name or password (or the account is disabled)")
        self.limiter.succeeded(address, name)
        return await self.signed_in(request, user, JSONResponse({"user": user.public()}))

    async def signed_in(self, request: Request[Any], user: User, response: Response) -> Response:
        """``response`` carrying a new sign-in of ``user``: the row in the store, the cookie."""
        secret = secrets.token_urlsafe(32)
        store = store_of(request)
        await store.prune_logins(utc_now())  # expired rows go as new ones come: the table stays small
        await store.create_login(secret_key(secret), user.id, utc_now(self.lifetime))
        response.set_cookie(COOKIE, secret, max_age=int(self.lifetime), path="/", httponly=True,
                            samesite="lax", secure=request.url.scheme == "https")
        return response

    async def signout(self, request: Request[Any]) -> Response:
        viewer = viewer_of(request)
        if viewer.login:
            await store_of(request).delete_login(viewer.login)
            revocations: Revocations = request.state["revocations"]
            revocations.revoke(viewer.login)
        response = Response(status_code=204)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="lax")
        return response

    async def me(self, request: Request[Any]) -> Response:
        viewer: Viewer | None = viewer_in(request.scope)
        user = viewer.user if viewer is not None else None
        return JSONResponse({"mode": self.mode, "user": user.public() if user else None})

    async def tokens(self, request: Request[Any]) -> Response:
        viewer = viewer_of(request)
        assert viewer.user is not None
        found = await store_of(request).list_tokens(viewer.user.id)
        return JSONResponse([{"id": t.id, "name": t.name, "created_at": t.created_at,
                              "last_used": t.last_used} for t in found])

    async def new_token(self, request: Request[Any]) -> Response:
        viewer = viewer_of(request)
        assert viewer.user is not None
        body = await read_json(request, MAX_SIGNIN_BYTES, self.reading)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not 1 <= len(name.strip()) <= MAX_TOKEN_NAME_CHARS:
            raise ClientError(f"name: expected 1 to {MAX_TOKEN_NAME_CHARS} characters")
        if len(await store_of(request).list_tokens(viewer.user.id)) >= MAX_TOKENS:
            raise ClientError(f"at most {MAX_TOKENS} API tokens each; delete one first")
        secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = ApiToken(uuid.uuid4().hex[:12], viewer.user.id, name.strip(), utc_now(), None)
        await store_of(request).create_token(token, secret_key(secret))
        return JSONResponse({"id": token.id, "name": token.name, "token": secret}, status_code=201)

    async def delete_token(self, request: Request[Any]) -> Response:
        viewer = viewer_of(request)
        assert viewer.user is not None
        token_id = str(request.path_params["token_id"])[:64]
        if not await store_of(request).delete_token(viewer.user.id, token_id):
            raise NotFound(f"no token {token_id!r}")
        return Response(status_code=204)

    async def users(self, request: Request[Any]) -> Response:
        return JSONResponse(await self.usage(request))

    async def admin_page(self, request: Request[Any]) -> Response:
        """The admin's page: every user with sessions, tokens and cost this month."""
        viewer = viewer_in(request.scope)
        if viewer is None or viewer.user is None or not viewer.user.admin:
            return PlainTextResponse("Not Found", status_code=404)  # as any path that names nothing
        response = self.templates.TemplateResponse(request, "admin.html", {
            "static_prefix": "/static", "rows": await self.usage(request), "month": month_start()[:7],
            "user": viewer.user})
        response.headers["Content-Security-Policy"] = self.policy
        return response

    async def usage(self, request: Request[Any]) -> list[dict[str, Any]]:
        viewer = viewer_of(request)
        if viewer.user is None or not viewer.user.admin:
            raise NotFound("no such page")  # a user learns nothing, not even that it exists
        store = store_of(request)
        rows = usage_rows(await store.usage_since(month_start()))
        for row in rows:
            row["api_tokens"] = len(await store.list_tokens(str(row["id"])))
        return rows


def _credentials(body: Any) -> tuple[str, str]:
    if not isinstance(body, dict):
        raise ClientError("body: expected an object with name and password")
    name, password = body.get("name"), body.get("password")
    if not isinstance(name, str) or not 1 <= len(name) <= 254:
        raise ClientError("name: required")
    if not isinstance(password, str) or not 1 <= len(password) <= MAX_PASSWORD_CHARS:
        raise ClientError("password: required")
    return name.strip(), password


def signin_routes(signin: Signin) -> list[Route]:
    return [
        Route("/signin", signin.page, methods=["GET"]),
        Route("/api/auth/signin", signin.signin, methods=["POST"]),
        Route("/api/auth/signout", signin.signout, methods=["POST"]),
        Route("/api/auth/me", signin.me, methods=["GET"]),
        Route("/api/auth/tokens", signin.tokens, methods=["GET"]),
        Route("/api/auth/tokens", signin.new_token, methods=["POST"]),
        Route("/api/auth/tokens/{token_id}", signin.delete_token, methods=["DELETE"]),
        Route("/api/admin/users", signin.users, methods=["GET"]),
        Route("/admin", signin.admin_page, methods=["GET"]),
    ]
