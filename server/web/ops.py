"""What operators and their tools ask of a running server: ``/healthz`` (liveness: the process
answers), ``/readyz`` (readiness: the store and, in live mode, Redis answer within a bound) and
``/metrics`` (Prometheus text, when ``[server] metrics`` is on; behind the same auth as ``/api``).

A load balancer takes an instance out of rotation on a failing ``/readyz`` while ``/healthz`` keeps
it from being restarted for an outage that is not its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.config.settings import Settings
from server.errors import MeterchatError
from server.sessions.metrics import CONTENT_TYPE, Metrics

READY_TIMEOUT_S = 2.0  # a check that takes longer counts as failed: the caller has its own timeout


def healthz(settings: Settings) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return JSONResponse({"ok": True, "providers": sorted(settings.providers),
                             "default_route": settings.default_route})
    return endpoint


async def readyz(request: Request) -> Response:
    """200 ``{"ready": true, "checks": {...}}`` when every part answers, else 503 naming the one
    that did not (``"store": "..."``, ``"live": "..."``)."""
    checks: dict[str, str] = {}
    for name, ping in request.state.ready_checks.items():
        checks[name] = await _check(ping)
    ready = all(result == "ok" for result in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


async def _check(ping: Callable[[], Awaitable[None]]) -> str:
    try:
        with anyio.fail_after(READY_TIMEOUT_S):
            await ping()
    except TimeoutError:
        return f"no answer within {READY_TIMEOUT_S:g} s"
    except MeterchatError as exc:
        return str(exc)[:300]
    return "ok"


def metrics_endpoint(metrics: Metrics) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)
    return endpoint
