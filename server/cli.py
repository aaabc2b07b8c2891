"""``meterchat [--config PATH] [--host HOST] [--port PORT]``: start the server.

Without ``--config`` the server starts on the embedded offline demo provider. A bad settings file
stops start-up with a message naming the key.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import replace

import uvicorn

from server.access import exposure_problem
from server.config import load_settings
from server.errors import ConfigError
from server.routing import RouteResolver
from server.serving import DrainingServer, redact_logs, uvicorn_options
from server.ws_guard import LingeringWebSocketProtocol


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="meterchat", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML settings file (default: the embedded demo)")
    parser.add_argument("--host", help="interface to listen on (overrides [server] host)")
    parser.add_argument("--port", type=int, help="TCP port (overrides [server] port; 0 = any free)")
    parser.add_argument("--insecure-no-auth", action="store_true",
                        help="serve a non-loopback address without an auth token (a proxy authenticates)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(args.config)
        RouteResolver(settings, {})  # model_routes and the default route resolve, or start-up stops
    except ConfigError as exc:
        print(f"meterchat: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    from server.app import create_app

    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    refuse_exposure(host, settings.server.auth_token, args.insecure_no_auth)
    # The Host allow-list admits the bound address: it must be the one actually bound.
    settings = replace(settings, server=replace(settings.server, host=host, port=port))
    try:
        app = create_app(settings)  # a database that cannot be used stops start-up here, in one line
    except ConfigError as exc:
        print(f"meterchat: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    print(f"meterchat: serving on http://{host}:{port}/ ({settings.source}; default route "
          f"{settings.default_route})", file=sys.stderr, flush=True)
    # No per-message deflate: chat frames are small and many, so compressing each costs more CPU
    # than it saves on a local or LAN link. Loop and WebSocket implementation were chosen by
    # bench/load.py (docs/performance.md): "auto" takes uvloop where pyproject installs it. The HTTP
    # parser is h11 with a deadline on request heads (server.serving.guarded_h11, slowloris).
    config = uvicorn.Config(app, host=host, port=port, log_level=args.log_level,
                            loop="auto", ws=LingeringWebSocketProtocol,
                            ws_max_size=16 * 1024 * 1024, ws_per_message_deflate=False,
                            **uvicorn_options(settings.server))
    redact_logs(profile.api_key for profile in settings.providers.values())
    DrainingServer(config, app).run()


def refuse_exposure(host: str, auth_token: str, insecure: bool) -> None:
    problem = exposure_problem(host, auth_token)
    if problem is None:
        return
    if not insecure:
        print(f"meterchat: {problem}", file=sys.stderr)
        raise SystemExit(2)
    print(f"meterchat: WARNING: --insecure-no-auth: serving {host} with NO authentication; anyone who "
          "can reach this address can read every conversation and spend your provider keys",
          file=sys.stderr, flush=True)
