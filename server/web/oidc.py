"""Single sign-on with an OpenID Connect provider (``[auth] oidc_issuer``), through ``authlib``.

    GET /signin/oidc            redirect to the provider (authorization code flow, state and nonce)
    GET /signin/oidc/callback   the provider's answer: the account, a sign-in cookie, the chat

The provider's ``sub`` names the account (``User.subject``): the first sign-in makes it (its name
from ``preferred_username``, else the email, made unique), later ones find it by ``sub`` whatever
the name or email became. ``oidc_admin_claim`` (e.g. ``groups``) decides the role on every sign-in,
as the provider is the source of truth; without it the first account is the admin. A disabled
account is refused like a wrong password. The flow's state lives in a short-lived signed cookie
(Starlette's ``SessionMiddleware``, keyed from the client secret so every instance reads it).
"""

from __future__ import annotations

import hashlib
import logging
import re
import warnings
from collections.abc import Mapping
from typing import Any

import authlib.deprecate  # noqa: F401  (its import sets an "always" filter; ours must come after it)
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from server.accounts.directory import Directory
from server.config.settings import AuthSettings
from server.errors import ClientError
from server.store.base import Store
from server.store.users import User
from server.web.signin import Signin

with warnings.catch_warnings():
    # authlib's httpx client says httpx is deprecated in favour of httpx2; this server runs httpx.
    warnings.filterwarnings("ignore", message="The httpx module is deprecated")
    from authlib.integrations.starlette_client import OAuth, OAuthError

log = logging.getLogger(__name__)
STATE_COOKIE = "meterchat_oidc"
STATE_SECONDS = 600  # time to sign in at the provider


def is_admin(claims: Mapping[str, Any], claim: str, values: list[str]) -> bool:
    value = claims.get(claim)
    if value is True:
        return True
    if isinstance(value, str):
        return value in values
    return isinstance(value, list) and any(item in values for item in value)


def account_name(claims: Mapping[str, Any]) -> str:
    """A name for a new account: ``preferred_username``, else the email, else ``sub``, without spaces."""
    raw = str(claims.get("preferred_username") or claims.get("email") or claims["sub"])
    return re.sub(r"\s+", "-", raw.strip())[:56] or "user"


class OidcSignin:
    def __init__(self, auth: AuthSettings, signin: Signin) -> None:
        self.auth = auth
        self.signin = signin
        self.oauth = OAuth()
        self.oauth.register(
            "provider", client_id=auth.oidc_client_id, client_secret=auth.oidc_client_secret,
            server_metadata_url=auth.oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
            client_kwargs={"scope": auth.oidc_scopes})

    def middleware(self) -> Middleware:
        key = hashlib.sha256(b"meterchat oidc state\0" + self.auth.oidc_client_secret.encode()).hexdigest()
        return Middleware(SessionMiddleware, secret_key=key, session_cookie=STATE_COOKIE,
                          max_age=STATE_SECONDS, same_site="lax")

    async def start(self, request: Request[Any]) -> Response:
        client = self.oauth.create_client("provider")
        response: Response = await client.authorize_redirect(request, str(request.url_for("oidc_callback")))
        return response

    async def callback(self, request: Request[Any]) -> Response:
        client = self.oauth.create_client("provider")
        try:
            token = await client.authorize_access_token(request)
        except OAuthError as exc:
            log.warning("oidc: the provider's answer was refused: %s", exc)
            return RedirectResponse("/signin?error=sso", status_code=303)
        claims = token.get("userinfo") or await client.userinfo(token=token)
        user = await self.account(request.state["store"], claims)
        if user is None or user.disabled:
            return RedirectResponse("/signin?error=disabled", status_code=303)
        return await self.signin.signed_in(request, user, RedirectResponse("/", status_code=303))

    async def account(self, store: Store, claims: Mapping[str, Any]) -> User | None:
        """The account of ``claims["sub"]``, made on its first sign-in; its role from the claims."""
        auth = self.auth
        role = ""
        if auth.oidc_admin_claim:
            role = "admin" if is_admin(claims, auth.oidc_admin_claim, auth.oidc_admin_values) else "user"
        user = await store.subject_user(str(claims["sub"]))
        if user is None:
            user = await self.new_account(store, claims, role)
        elif role and user.role != role:
            await store.set_role(user.id, role)
            user = await store.get_user(user.id)
        return user

    async def new_account(self, store: Store, claims: Mapping[str, Any], role: str) -> User | None:
        name, email = account_name(claims), str(claims.get("email") or "")
        for suffix in ("", "-2", "-3", "-4"):  # a local account may hold the name already
            try:
                return await Directory(store).add(name + suffix, None, email=email, role=role,
                                                  subject=str(claims["sub"]))
            except ClientError:
                continue
        return None


def oidc_routes(sso: OidcSignin) -> list[Route]:
    return [Route("/signin/oidc", sso.start, methods=["GET"]),
            Route("/signin/oidc/callback", sso.callback, methods=["GET"], name="oidc_callback")]
