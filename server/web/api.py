"""The sessions REST API, over any ``server.store.base.Store``.

    GET    /api/sessions                         200 [summary, ...] (newest first)
    POST   /api/sessions/import                  201 {"session_id"}   body: an exported JSON document
    GET    /api/sessions/{id}                    200 summary
    PATCH  /api/sessions/{id}                    200 summary          body: {"title": str}
    DELETE /api/sessions/{id}                    204
    GET    /api/sessions/{id}/export?format=md|json   200 attachment (text/markdown or application/json)

A summary is ``{id, title, route, created_at, updated_at, message_count}``. Every error is
``{"error": {"code", "message"}}`` (``error_body``): 400 bad input, 404 unknown session, 409 id
taken, 413 body over its limit (an import: ``server.max_import_bytes``), 408 a body not complete
within ``BODY_SECONDS``, 503 ``busy`` when the bodies being read at once would pass the ``Reading``
bound (``MAX_READING_BYTES``, or one whole import when that is larger); routes raise ``ClientError`` and
the application's ``EXCEPTION_HANDLERS`` render it. Authentication is the application's
middleware (``server.web.auth``); this module shows a signed-in user only the sessions they own and
answers for anyone else's exactly as for an id that names nothing.

The routes read their services from the lifespan state (``ApiState``): the ``store``, and
``on_change(id, what)``, awaited after a committed ``renamed``, ``deleted`` or ``imported`` so live
sessions can follow; its failure is logged and does not undo the answer.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NotRequired, TypedDict

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.accounts.viewer import ANYONE, Viewer, viewer_in
from server.errors import (
    Busy,
    ClientError,
    Forbidden,
    NotFound,
    SessionExists,
    SigninFlood,
    SlowBody,
    TooLarge,
    Unauthorized,
    UnknownSession,
    UnknownUser,
    UserExists,
)
from server.protocol import echo
from server.store.base import SessionSummary, Store
from server.web.export import from_json, to_json
from server.web.markdown import to_markdown

OnChange = Callable[[str, str], Awaitable[None]]
MAX_IMPORT_BYTES = 32 * 1024 * 1024  # tests' default; the server passes server.max_import_bytes
MAX_PATCH_BYTES = 64 * 1024
MAX_TITLE_CHARS = 200
MAX_LIST_LIMIT = 500
MAX_QUERY_CHARS = 200
MAX_ID_CHARS = 200  # longer than any id this server makes or imports
# A body is held whole until it is parsed: without these, clients sending all but the last byte of
# a 32 MiB import on each of the server's connections held 32 MiB each, for ever.
MAX_READING_BYTES = 64 * 1024 * 1024  # bodies being read at once (at least one whole import)
BODY_SECONDS = 60.0  # a 32 MiB import over a link of 0.5 MiB/s
_STATUS = ((UnknownSession, 404), (UnknownUser, 404), (NotFound, 404), (SessionExists, 409),
           (UserExists, 409), (TooLarge, 413), (SlowBody, 408), (Busy, 503), (Unauthorized, 401),
           (Forbidden, 403), (SigninFlood, 429), (ClientError, 400))
log = logging.getLogger(__name__)


class ApiState(TypedDict):
    """What the routes read from ``request.state`` (the application's lifespan yields it; the
    ``viewer``, who is asking, comes from ``server.web.auth.Authenticator``)."""

    store: Store
    on_change: OnChange
    viewer: NotRequired[Viewer | None]


ApiRequest = Request[ApiState]


def error_body(code: str, message: str) -> dict[str, Any]:
    """The one shape of an HTTP error answer."""
    return {"error": {"code": code, "message": message}}


def error_response(request: Request, exc: Exception) -> Response:
    """The ``ClientError`` handler: its status from the class, its body from ``error_body``."""
    if not isinstance(exc, ClientError):  # registered for ClientError only; anything else is a bug
        raise exc
    status = next(code for kind, code in _STATUS if isinstance(exc, kind))
    return JSONResponse(error_body(exc.code, exc.message), status_code=status)


EXCEPTION_HANDLERS: Mapping[Any, Callable[[Request, Exception], Response]] = {ClientError: error_response}


class Reading:
    """The bytes of request bodies being read at once; a body that would pass ``limit`` is refused."""

    def __init__(self, limit: int = MAX_READING_BYTES) -> None:
        self.limit = limit
        self.used = 0

    async def body(self, request: Request[Any], limit: int, named: str = "") -> bytearray:
        """The body, refused (413) past ``limit``, (503) past the shared bound, (408) if slow."""
        body = bytearray()
        try:
            with anyio.fail_after(BODY_SECONDS):
                async for chunk in request.stream():
                    self.take(len(chunk))
                    body += chunk
                    if len(body) > limit:
                        raise TooLarge(f"body: over the limit of {limit:,} bytes{named}")
        except TimeoutError as exc:
            raise SlowBody(f"body: not complete within {BODY_SECONDS:g} s") from exc
        finally:
            self.used -= len(body)
        return body

    def take(self, size: int) -> None:
        if self.used + size > self.limit:
            raise Busy("body: the server is reading too many large bodies at once; try again later")
        self.used += size


async def read_json(request: Request[Any], limit: int, reading: Reading, setting: str = "") -> Any:
    """The request body as JSON, refusing (413) before reading more than ``limit`` bytes (the
    message names the ``setting`` that sets it, if any)."""
    named = f" ({setting})" if setting else ""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body: {int(declared):,} bytes is over the limit of {limit:,} bytes{named}")
    body = await reading.body(request, limit, named)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise ClientError(f"body: not valid JSON ({exc})") from exc
    except RecursionError as exc:  # nesting deeper than Python's recursion limit
        raise ClientError("body: not valid JSON (nested too deeply)") from exc


class SessionsApi:
    def __init__(self, max_import_bytes: int) -> None:
        self.max_import_bytes = max_import_bytes
        # One per application, so one per server process: the memory it bounds is the process's.
        self.reading = Reading(max(MAX_READING_BYTES, max_import_bytes))

    async def list(self, request: ApiRequest) -> Response:
        params = request.query_params
        query = params.get("q", "")
        if len(query) > MAX_QUERY_CHARS:
            raise ClientError(f"q: at most {MAX_QUERY_CHARS} characters, got {len(query):,}")
        before_id = params.get("before_id") or None
        if before_id is not None and len(before_id) > MAX_ID_CHARS:
            raise ClientError(f"before_id: at most {MAX_ID_CHARS} characters, got {len(before_id):,}")
        found = await request.state["store"].list_sessions(query, params.get("before") or None,
                                                           _limit(params.get("limit")), before_id,
                                                           _viewer(request).owner)
        return JSONResponse([summary.to_dict() for summary in found])

    async def get(self, request: ApiRequest) -> Response:
        return JSONResponse((await _summary(request, await _visible_id(request))).to_dict())

    async def rename(self, request: ApiRequest) -> Response:
        session_id = await _visible_id(request)
        title = _title(await read_json(request, MAX_PATCH_BYTES, self.reading))
        await request.state["store"].rename_session(session_id, title)
        await _changed(request, session_id, "renamed")
        return JSONResponse((await _summary(request, session_id)).to_dict())

    async def delete(self, request: ApiRequest) -> Response:
        session_id = await _visible_id(request)
        await request.state["store"].delete_session(session_id)
        await _changed(request, session_id, "deleted")
        return Response(status_code=204)

    async def export(self, request: ApiRequest) -> Response:
        kind = request.query_params.get("format", "json")
        if kind not in ("md", "json"):
            raise ClientError(f"format: expected md or json, got {echo(kind)}")
        session_id = await _visible_id(request)
        session = await request.state["store"].get_session(session_id)
        if session is None:
            raise UnknownSession(f"no session {echo(session_id)}")
        filename = _filename(session.title, session_id, kind)
        headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
        if kind == "md":
            return Response(to_markdown(session), media_type="text/markdown; charset=utf-8", headers=headers)
        body = json.dumps(to_json(session), ensure_ascii=False, indent=2)
        return Response(body, media_type="application/json", headers=headers)

    async def import_(self, request: ApiRequest) -> Response:
        body = await read_json(request, self.max_import_bytes, self.reading, "server.max_import_bytes")
        session = from_json(body)
        await request.state["store"].import_session(session, _viewer(request).owner)  # the importer's
        await _changed(request, session.id, "imported")
        return JSONResponse({"session_id": session.id}, status_code=201)


def _session_id(request: ApiRequest) -> str:
    """The path's session id; one longer than any id this server makes names no session (and is
    never quoted back whole by the store's errors)."""
    session_id: str = request.path_params["session_id"]
    if len(session_id) > MAX_ID_CHARS:
        raise UnknownSession(f"no session {echo(session_id)}")
    return session_id


def _viewer(request: ApiRequest) -> Viewer:
    return viewer_in(request.scope) or ANYONE  # a route served without the middleware


async def _visible_id(request: ApiRequest) -> str:
    """The path's session id, when the viewer may see that session; else ``UnknownSession``, the
    same answer (404, same message) as for an id that names nothing."""
    session_id = _session_id(request)
    if not _viewer(request).sees(await request.state["store"].session_owner(session_id)):
        raise UnknownSession(f"no session {echo(session_id)}")
    return session_id


async def _summary(request: ApiRequest, session_id: str) -> SessionSummary:
    summary = await request.state["store"].get_summary(session_id)
    if summary is None:
        raise UnknownSession(f"no session {echo(session_id)}")
    return summary


async def _changed(request: ApiRequest, session_id: str, what: str) -> None:
    try:
        await request.state["on_change"](session_id, what)
    except Exception:  # the store already holds the change; the answer must say so
        log.exception("on_change(%r, %r) failed", session_id, what)


def _limit(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise ClientError(f"limit: expected a whole number from 1 to {MAX_LIST_LIMIT}, got {echo(raw)}")
    return int(raw)


def _title(data: Any) -> str:
    if not isinstance(data, dict) or "title" not in data:
        raise ClientError("title: required")
    title = data["title"]
    if not isinstance(title, str):
        raise ClientError(f"title: expected a string, got {type(title).__name__}")
    title = title.strip()
    if not title or len(title) > MAX_TITLE_CHARS:
        raise ClientError(f"title: expected 1 to {MAX_TITLE_CHARS} characters, got {len(title)}")
    return title


def _filename(title: str, session_id: str, extension: str) -> str:
    # ASCII only: a header value cannot carry the title's other characters unencoded.
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:48] or "session"
    return f"meterchat-{slug}-{session_id[:8]}.{extension}"


def api_routes(max_import_bytes: int = MAX_IMPORT_BYTES) -> list[Route]:
    api = SessionsApi(max_import_bytes)
    one = "/api/sessions/{session_id}"
    return [
        Route("/api/sessions", api.list, methods=["GET"]),
        Route("/api/sessions/import", api.import_, methods=["POST"]),
        Route(one, api.get, methods=["GET"]),
        Route(one, api.rename, methods=["PATCH"]),
        Route(one, api.delete, methods=["DELETE"]),
        Route(one + "/export", api.export, methods=["GET"]),
    ]
